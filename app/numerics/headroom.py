"""Each layer's headroom: its largest absolute output on a probe batch against its dtype's
largest finite value, measured every N steps (``--numerics-every``), kept per layer (the
latest, and the least seen), and a warning once per layer under ``limits.WARN_BITS``.

The probe is one traced inference pass (``training=False``: nothing in the model moves)
recording every layer through the tap; a step traced meanwhile is left alone, so in
``--loop fit`` it runs in the monitor's thread while Keras trains.  The same call tests
every weight for a NaN or an inf: one call and one read for both, where an eager test
of each weight took two ops per weight (1.3 ms every probe for the mlp's six weights in
the image).
"""
from __future__ import annotations

import math
import threading
from typing import Dict, List, NamedTuple, Optional, Sequence

import tensorflow as tf

from app.core.catalog import SIXTEEN_BIT
from app.numerics import limits
from app.numerics.diagnosis import float32_set, float32_words
from app.numerics.tap import Tap, largest_finite
from app.precision import finite


class Probed(NamedTuple):
    """What one probe found: {layer path: (dtype, largest finite |output|, all finite)},
    and whether every weight of the model is finite."""
    layers: Dict[str, tuple]
    weights_finite: bool


class HeadroomProbe:
    """``measure(x)`` -> ``Probed``."""

    def __init__(self, model, entries):
        self.model, self.entries = model, entries
        self.meta: list = []
        self._fn = None
        self.lock = threading.Lock()

    def _trace(self, x):
        model, entries, meta = self.model, self.entries, self.meta

        @tf.function
        def probe(x):
            with Tap(entries) as tap, tap.recording() as calls:
                model(x, training=False)
            meta[:] = [(c.path, c.dtype) for c in calls]
            rows = []
            for c in calls:
                rows.append(tf.stack([largest_finite(c.outputs),
                                      tf.cast(finite.all_finite(c.outputs), tf.float32)]))
            weights = finite.floating_variables(model.weights)
            weights_ok = finite.all_finite(weights) if weights else tf.constant(True)
            return (tf.stack(rows) if rows else tf.zeros([0, 2])), weights_ok
        probe.get_concrete_function(x)   # traced now, with the tap on; the tap is gone after
        return probe

    def measure(self, x) -> Probed:
        with self.lock:
            if self._fn is None:
                self._fn = self._trace(x)
            rows, weights_ok = self._fn(x)
            out: Dict[str, tuple] = {}
            for (path, dtype), (largest, finite) in zip(self.meta, rows.numpy()):
                old = out.get(path)   # a layer called twice: its larger value
                if old is None or largest > old[1] or not finite:
                    out[path] = (dtype, float(largest), bool(finite) and (old is None or old[2]))
            return Probed(out, bool(weights_ok))


class Headroom:
    """What the probes found, per layer, and the warnings they gave."""

    def __init__(self):
        self.layers: Dict[str, dict] = {}
        self.warned: set = set()

    def update(self, step: int, measured: Dict[str, tuple], command_line: bool = True,
               kept: Sequence[str] = ()) -> List[str]:
        """Record one probe; returns the warnings it gives (each layer warns once), naming
        the setting as ``tfmp train`` (``command_line``) or ``app.train`` takes it, with the
        run's own float32 layers ``kept``."""
        warnings = []
        for path, (dtype, largest, finite) in measured.items():
            if dtype not in SIXTEEN_BIT and dtype not in limits.LARGEST:
                continue
            bits = limits.headroom_bits(largest if finite else math.inf, dtype or "float32")
            rec = self.layers.setdefault(path, {"dtype": dtype, "least_bits": None,
                                                "least_at_step": None})
            rec.update(latest_max_abs=largest, latest_bits=_round(bits), step=step,
                       finite=finite)
            if rec["least_bits"] is None or (bits is not None and bits < rec["least_bits"]):
                rec.update(least_bits=_round(bits), least_at_step=step)
            if bits is not None and bits < limits.WARN_BITS and path not in self.warned:
                self.warned.add(path)
                warnings.append(warning_text(path, dtype, largest, finite, bits, step,
                                             command_line, kept))
        return warnings

    def scalars(self) -> Dict[str, float]:
        """TensorBoard: numerics/headroom_bits/<layer> of the latest probe."""
        return {f"numerics/headroom_bits/{p}": r["latest_bits"] for p, r in self.layers.items()
                if r.get("latest_bits") is not None and math.isfinite(r["latest_bits"])}

    def to_json(self) -> Dict[str, dict]:
        return {p: {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                    for k, v in r.items()} for p, r in self.layers.items()}


def warning_text(path: str, dtype: str, largest: float, finite: bool, bits: float,
                 step: int, command_line: bool = True, kept: Sequence[str] = ()) -> str:
    """The warning for one layer; the setting that runs it in float32 in the words of what
    runs the run, naming the run's own float32 layers ``kept`` too (its value replaces
    them: ``app.numerics.diagnosis.float32_set``)."""
    limit = limits.largest(dtype)
    setting = float32_words(float32_set(kept, path), command_line)
    if not finite:
        return (f"layer '{path}' gave a non-finite output on the probe batch at step {step} "
                f"({dtype}, largest finite {limit:g}); if training follows it will stop there: "
                f"run it in float32 with {setting}")
    return (f"layer '{path}' output reached {largest:.4g} of {dtype}'s largest {limit:g} at "
            f"step {step} (headroom {bits:.1f} bits, under {limits.WARN_BITS:g}); if it keeps "
            f"growing it will overflow: {setting} runs it in float32")


def _round(bits: Optional[float]) -> Optional[float]:
    if bits is None or not math.isfinite(bits):
        return bits
    return round(bits, 3)
