"""``docker stop`` (SIGTERM) on a running ``tfmp tune``: exit 143 as before, with the line
Ctrl-C gets (``interrupted (Ctrl-C): tfmp tune stopped``), not silently."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from app import cli
from app.tuner import tuning as api
from app.tuner.search import Outcome

MIB = 2**20


class TerminatedRunner:
    """The second trial gets SIGTERM, as from ``docker stop``."""
    trials = 0

    def __init__(self, base_request, workdir, *, kill_above, timeout=None):
        self.workdir = workdir

    def __call__(self, policy, batch_size, any_fit, phase="search", **overrides):
        TerminatedRunner.trials += 1
        if TerminatedRunner.trials == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return Outcome(True, 100 * MIB + batch_size * MIB, 100.0 * batch_size, "", 0.1)

    def verify(self, policy, batch_size, steps, accumulate=1):
        return Outcome(True, 100 * MIB + batch_size * MIB, 100.0 * batch_size, "", 0.1)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="the SIGTERM handler is installed in the main thread only")
def test_sigterm_during_a_tune_is_said_in_one_line_exit_143(tmp_path, monkeypatch, capsys):
    TerminatedRunner.trials = 0
    monkeypatch.setattr(api, "TrialRunner", TerminatedRunner)
    monkeypatch.setattr(api, "collect_environment", lambda: {
        "hardware": {"gpus": []}, "auto_precision": {"policy": "float32"}})
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "t"
    with pytest.raises(SystemExit) as info:
        cli.main(["tune", "--model", "mlp", "--dataset", "synthetic", "--precision", "float32",
                  "--memory-budget", "1GiB", "--max-batch", "64", "--output", str(out),
                  "--quiet"])
    assert info.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is before          # the handler is put back
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err[-1] == "interrupted (SIGTERM): tfmp tune stopped", err
    assert not out.exists()                                    # cleaned up, as before
