"""A progress bar across all trials of a tune (plain lines when stderr is not a terminal)."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

from app.tuner.budget import format_size


class Progress:
    def __init__(self, expected: int, stream: Optional[TextIO] = None,
                 tty: Optional[bool] = None, enabled: bool = True):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.expected, self.done, self.enabled = max(1, expected), 0, enabled
        self.t0 = time.monotonic()

    def _bar(self, label: str) -> str:
        width = 24
        filled = min(width, int(width * self.done / self.expected))
        elapsed = int(time.monotonic() - self.t0)
        return (f"\r[{'#' * filled}{'-' * (width - filled)}] {self.done}/~{self.expected} "
                f"trials, {elapsed // 60}m{elapsed % 60:02d}s  {label}\033[K")

    def start(self, policy: str, batch_size: int, phase: str = "search") -> None:
        if not self.enabled:
            return
        what = "verifying" if phase == "verify" else "trying"
        if self.tty:
            self.stream.write(self._bar(f"{what} {policy} at batch {batch_size} ..."))
            self.stream.flush()

    def finish(self, policy: str, trial) -> None:
        self.done += 1
        self.expected = max(self.expected, self.done)
        if not self.enabled:
            return
        line = (f"[tune] {policy:<15} batch {trial.batch_size:>5}: "
                + (f"fits, peak {format_size(trial.peak_memory_bytes)}, "
                   f"{trial.samples_per_second:,.0f} samples/s" if trial.fits else
                   f"does not fit: {trial.reason}")
                + (f" ({trial.seconds:.0f} s)" if trial.seconds else ""))
        if self.tty:
            self.stream.write("\r\033[K" + line + "\n" + self._bar(""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def say(self, text: str) -> None:
        if not self.enabled:
            return
        self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()
