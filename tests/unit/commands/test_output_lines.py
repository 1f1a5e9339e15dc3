"""What a run prints reaches a log as whole lines, and a bad flag as one line, however the
process is run: unbuffered, as the image runs Python, and with stdout and stderr joined
(``docker run ... 2>&1``, a scheduler's log)."""
from __future__ import annotations

import socket
import subprocess
import sys

import re

from tests.paths import ROOT
from tests.unit.helpers import ONCE_IN_THE_IMAGE, app_env, run_app


# TensorFlow's C++ start-up log (TF 2.21 on the host writes a few through absl before
# TF_CPP_MIN_LOG_LEVEL is read): not the app's lines.
_CPP_LOG = re.compile(r"[IWEF]\d{4} |WARNING: All log messages before absl::InitializeLog")


def _writes(*args) -> list:
    """Every write(2) the command makes to stdout and stderr, one message each: both go
    to one end of a SOCK_SEQPACKET pair, which keeps the boundaries of writes."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([sys.executable, "-m", "app", *args], stdout=theirs,
                            stderr=theirs, cwd=ROOT,
                            env=app_env({"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}))
    theirs.close()
    writes = []
    with ours:
        while True:
            message = ours.recv(1 << 16)
            if not message:
                break
            writes.append(message.decode(errors="replace"))
    assert proc.wait(timeout=300) == 0, "".join(writes)[-3000:]
    return writes


@ONCE_IN_THE_IMAGE
def test_a_runs_lines_are_written_whole(tmp_path):
    """Written in two parts (a line's text, then its newline) a line of the other stream
    landed between them in a joined log: "precision: float32 (requested explicitly)strategy:
    one (...)", then an empty line."""
    writes = _writes("train", "--model", "mlp", "--dataset", "synthetic", "--precision",
                     "float32", "--epochs", "1", "--max-train-samples", "256",
                     "--max-val-samples", "64", "--batch-size", "64", "--progress", "lines",
                     "--offline", "--no-save-model", "--output", str(tmp_path / "run"))
    ours = [w for w in writes if w.startswith(("precision:", "strategy:", "epoch ", "done:"))]
    assert [w.split(":")[0].split()[0] for w in ours][:2] == ["precision", "strategy"], writes
    assert any(w.startswith("done:") for w in ours), writes
    assert all(w.endswith("\n") for w in ours), ours
    assert "\n" not in writes, writes


@ONCE_IN_THE_IMAGE
def test_a_bad_layer_name_in_check_is_its_one_line():
    """check's default policy is mixed_float16: Keras 2 logged three lines of its own device
    check ("Mixed precision compatibility check (mixed_float16): WARNING ...") before the
    flag's error."""
    proc = run_app("check", "--model", "mlp", "--float32-layers", "dens_1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()
             and not _CPP_LOG.match(line)]
    assert len(lines) == 1 and lines[0].startswith("error: --float32-layers 'dens_1'"), lines
