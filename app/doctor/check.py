"""``app.check(...)``: the doctor from a notebook or a script, no command line.

    import app
    report = app.check(model=build, input_shape=(28, 28, 1))        # synthetic data
    report = app.check(model="nets.small:build", data=load_fn)      # your data
    report["verdict"], report["findings"]

Same checks and report as ``tfmp check``; prints the text report unless
``verbose=False``.  Bad input raises ``app.core.errors.UsageError``; an exception from your own
code raises ``app.core.errors.UserCodeError`` (``.original`` keeps it, with its traceback).  The
global dtype policy is restored afterwards.
"""
from __future__ import annotations

from typing import Any, Optional

from app.doctor.run import DEFAULT_BATCH, DEFAULT_PRECISION, DEFAULT_STEPS


def check(model: Any, data: Any = None, precision: str = DEFAULT_PRECISION,
          batch_size: int = DEFAULT_BATCH, steps: int = DEFAULT_STEPS,
          input_shape: Optional[Any] = None, num_classes: Optional[int] = None,
          loss: Any = None, metrics: Any = None, seed: int = 0, json_path: Optional[str] = None,
          verbose: bool = True, float32_layers: Any = None) -> dict:
    """Check ``model`` under ``precision`` and return the report dict.

    model: a built-in name, "MODULE:FUNCTION" / "file.py:FUNCTION", a function
        ``(input_shape, num_classes) -> keras.Model`` (declare only what you need), or a
        built keras.Model (then built before the policy: check says so).
    data: None (synthetic data of ``input_shape``), a dataset spec, a function returning
        ``((x_train, y_train), (x_val, y_val))`` or ``(train, val)`` unbatched tf.data
        datasets, or that value itself.
    precision: float32, mixed_float16 (default), mixed_bfloat16 or auto.
    json_path: also write the report there as JSON (atomically).
    float32_layers: layer names (a list or "a,b") to run in float32, as ``tfmp train
        --float32-layers`` would: check the model as that run trains it.
    """
    from app.doctor.report import to_text
    from app.doctor.run import check_args, run_check
    from app.precision.policy import validate_name
    from app.task.task import Task

    validate_name(precision)
    check_args(batch_size, steps, seed)
    task = Task.from_objects(model, data, loss, metrics, input_shape, num_classes,
                             float32_layers=float32_layers)
    report = run_check(task, precision, batch_size, steps, seed=seed)
    if verbose:
        print(to_text(report), flush=True)
    if json_path:
        from app.core.files import write_json_atomic

        write_json_atomic(json_path, report)
    return report
