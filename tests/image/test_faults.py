"""A full disk under a real training job in the image (issue 11): the output is a small
tmpfs, filled by a ballast file so that the first checkpoint fits and the second does not.
One line, exit status 5, no traceback, no half-written checkpoint, the last good one
intact; after the ballast is removed (space freed) the same command with --resume
finishes the job."""
from __future__ import annotations

import pytest

from image_helpers import docker_run

pytestmark = pytest.mark.docker

# mlp: ~0.54 M parameters; a checkpoint with Adam's two slots is ~6.5 MB.
SCRIPT = r"""
set -u
free_kb=$(df -k --output=avail /out | tail -n 1)
fallocate -l $(( (free_kb - 9000) * 1024 )) /out/ballast
train() { python -m app train --model mlp --dataset synthetic --precision float32 \
  --epochs 3 --max-train-samples 512 --max-val-samples 64 --batch-size 64 \
  --no-save-model --progress lines --offline --output /out/run "$@"; }
train >/out/first.log 2>/out/first.err; echo "FIRST=$?"
echo "ERRORS=$(grep -c '^error:' /out/first.err)"
grep '^error:' /out/first.err
grep -c Traceback /out/first.err | sed 's/^/TRACEBACKS=/'
ls /out/run/checkpoints | sed 's/^/CKPT /'
python -c "import json; print('STATUS', json.load(open('/out/run/metrics.json'))['status'])"
rm /out/ballast
train --resume >/out/second.log 2>&1; echo "SECOND=$?"
python -c "import json; m = json.load(open('/out/run/metrics.json')); print('FINAL', m['status'], [e['epoch'] for e in m['epochs']])"
"""


def test_disk_full_is_one_line_and_resume_finishes(image):
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "--tmpfs", "/out:size=24m,mode=1777",
                      command=["bash", "-c", SCRIPT], timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert "FIRST=5" in out and "ERRORS=1" in out and "TRACEBACKS=0" in out, out
    assert "no space left on the device" in out and "--resume to continue from ckpt-1" in out
    ckpts = [line for line in out.splitlines() if line.startswith("CKPT ")]
    assert "CKPT ckpt-1.index" in ckpts and not [c for c in ckpts if "_temp" in c], out
    assert "cannot write /out/run/checkpoints:" in out, out
    assert "STATUS failed" in out, out
    assert "SECOND=0" in out and "FINAL completed [1, 2, 3]" in out, out
