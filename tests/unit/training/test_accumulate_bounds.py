"""--accumulate and --global-batch have an upper bound, checked with the other settings: a
huge value (99999999999999999999) was accepted, made the run folder (metrics.json, the
lock, tensorboard/) and ended in a traceback (an out-of-range integer to a Tensor in fit,
an OverflowError in the custom loop); 2**31 micro-batches trained on NaN.  Now one line,
exit 2, nothing written.  The global batch they make (micro-batch x N) is bounded alike."""
from __future__ import annotations

import pytest

from app.core.errors import UsageError
from app.training.config import (LARGEST_GLOBAL_BATCH, TrainConfig, check_accumulation,
                                 resolve_config)
from tests.unit.helpers import run_app

HUGE = "99999999999999999999"


@pytest.mark.parametrize("args, env, line", [
    (["--accumulate", HUGE], {},
     "error: --accumulate must be at most 2147483647 (2**31-1). Received: --accumulate="
     f"{HUGE}; allowed: an integer from 1 to 2147483647 (1: no accumulation)"),
    ([], {"TFMP_ACCUMULATE": HUGE},
     "error: TFMP_ACCUMULATE must be at most 2147483647 (2**31-1). Received: TFMP_ACCUMULATE="
     f"{HUGE}; allowed: an integer from 1 to 2147483647 (1: no accumulation)"),
    (["--global-batch", HUGE], {},
     "error: --global-batch must be at most 2147483647 (2**31-1). Received: --global-batch="
     f"{HUGE}; allowed: an integer from 1 to 2147483647"),
    (["--accumulate", "2147483648", "--loop", "custom"], {},
     "error: --accumulate must be at most 2147483647 (2**31-1). Received: "
     "--accumulate=2147483648; allowed: an integer from 1 to 2147483647 (1: no accumulation)"),
    (["--accumulate", "67108864", "--batch-size", "32"], {},
     "error: --accumulate 67108864 x the micro-batch 32 (--batch-size 32) is a global batch of "
     "2147483648, more than 2147483647 (2**31-1). Received: --accumulate=67108864; allowed: "
     "--accumulate from 1 to 67108863, or a smaller --batch-size"),
    # the micro-batch and steps per execution alike (an OverflowError in the input pipeline)
    (["--batch-size", HUGE], {},
     "error: --batch-size must be at most 2147483647 (2**31-1). Received: --batch-size="
     f"{HUGE}; allowed: an integer from 1 to 2147483647"),
    ([], {"TFMP_STEPS_PER_EXECUTION": HUGE},
     "error: TFMP_STEPS_PER_EXECUTION must be at most 2147483647 (2**31-1). Received: "
     f"TFMP_STEPS_PER_EXECUTION={HUGE}; allowed: an integer from 1 to 2147483647"),
])
def test_a_huge_accumulation_is_one_line_and_writes_nothing(tmp_path, args, env, line):
    out, ws = tmp_path / "run", tmp_path / "ws"
    done = run_app("train", "--dataset", "synthetic", "--max-train-samples", "64", "--epochs",
                   "1", "--offline", "--output", str(out), "--workspace", str(ws), *args,
                   env=env, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [line], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert not out.exists() and not ws.exists()


def test_the_largest_values_pass_and_the_product_counts_the_replicas():
    assert check_accumulation(TrainConfig(batch_size=1, accumulate=LARGEST_GLOBAL_BATCH)) \
        == LARGEST_GLOBAL_BATCH
    assert check_accumulation(TrainConfig(batch_size=1, global_batch=LARGEST_GLOBAL_BATCH)) \
        == LARGEST_GLOBAL_BATCH
    assert check_accumulation(TrainConfig(batch_size=32, accumulate=67108863)) == 67108863
    # app.train's keywords: the setting's own name
    with pytest.raises(UsageError, match=r"^error: accumulate must be at most 2147483647"):
        resolve_config({"accumulate": int(HUGE)}, environ={})
    # once the replicas are known (the strategy), the micro-batch is the global one
    with pytest.raises(UsageError) as info:
        check_accumulation(TrainConfig(batch_size=32, accumulate=67108863), replicas=2)
    assert "a global batch of 4294967232, more than 2147483647" in str(info.value)
