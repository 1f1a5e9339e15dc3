"""``python -m app train`` in the background, for the tests that stop it with a signal.

Its output is read on threads as it comes, so a test waits for a known point in the run
(a ``step N:`` line after the ``epoch 1/E:`` line: training is inside epoch 2) and fails
when that point never comes, instead of signalling blindly after a sleep.
"""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time

from tests.paths import ROOT


class TrainingProcess:
    def __init__(self, args, env: dict | None = None):
        full_env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        full_env.update(env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "app", *args], env=full_env,
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._lines: queue.Queue = queue.Queue()
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout,
                                                                   self._lines), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr,
                                                                   None), daemon=True)]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, into: list, lines: queue.Queue | None):
        for line in stream:
            into.append(line)
            if lines is not None:
                lines.put(line)
        if lines is not None:
            lines.put(None)  # end of output

    def _output(self) -> str:
        return "".join(self.stdout)[-2000:] + "".join(self.stderr)[-3000:]

    def wait_inside_epoch(self, epoch: int, timeout: float = 180) -> str:
        """Block until a step of ``epoch`` (1-based) is logged; that step line.  Fails when
        the run ends, finishes that epoch first, or gets there not within ``timeout``."""
        deadline = time.monotonic() + timeout
        after_previous = epoch == 1
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no step of epoch {epoch} logged within {timeout:.0f} s:\n"
                                     + self._output())
            try:
                line = self._lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(timeout=30)
                raise AssertionError(f"the run ended (status {self.proc.returncode}) before "
                                     f"epoch {epoch}:\n" + self._output())
            if line.startswith(f"epoch {epoch}/"):
                raise AssertionError(f"epoch {epoch} ended before any of its steps was logged: "
                                     "more samples or a smaller --log-every\n" + self._output())
            if line.startswith(f"epoch {epoch - 1}/"):
                after_previous = True
            elif after_previous and line.startswith("step "):
                return line

    def send(self, signum: int) -> None:
        assert self.proc.poll() is None, "the run ended before the signal:\n" + self._output()
        self.proc.send_signal(signum)

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        """Wait for the exit (``timeout`` only guards against a hang); status, stdout, stderr."""
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        for reader in self._readers:
            reader.join(timeout=30)
        return code, "".join(self.stdout), "".join(self.stderr)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
