"""The sentinel's report of a fault: where it began, the values, the float32 verdict and the
fix, as one console block and as metrics.json's ``numerics.fault``.  No TensorFlow here.

Verdicts:
* ``precision``: the same batch from the same weights is finite in float32: the 16-bit
  dtype is the cause; the fix names the layer (``--float32-layers``) and what else helps;
* ``data``: samples of the batch are not finite (their positions in the epoch);
* ``optimizer``: the weights went non-finite, or grew far from where they started, and
  the batch is non-finite in float32 too: the learning rate;
* ``model``: a layer or the loss is non-finite in float32 too (log(0), a division by 0);
* ``not reproduced``: the replay of the stashed batch is finite (dropout, or the weights
  moved since): the fault's own words are all there is;
* ``not replayed``: a fault the step latched no batch of (a rule's over the step counters,
  ``unreplayed``): the block says what happened and what to run to find where.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence

from app.numerics import limits
from app.task import float32_layers
from app.task.data_rows import listed, rows_in


@dataclass
class Where:
    """Where the fault began: a layer (forward or backward), the input samples, the
    weights, the loss, or nothing found."""
    kind: str                       # layer | input samples | weights | loss | none | unreplayed
    name: Optional[str] = None      # the layer's full path, the variables, the loss's name
    class_name: Optional[str] = None
    dtype: Optional[str] = None     # the layer's compute dtype in the run
    phase: str = "forward"          # forward | backward
    samples: List[int] = field(default_factory=list)   # positions in the epoch
    # The training data's rows those samples are (app.task.data_rows), when it has rows:
    data: Optional[str] = None      # the arrays named: 'x_train', 'y_train' or both
    rows: List[int] = field(default_factory=list)      # the samples' rows
    bad_rows: List[int] = field(default_factory=list)  # every non-finite row (the first 1000)
    bad_rows_total: Optional[int] = None
    # The loss: it returns one value for the whole batch (it reduces itself), so no sample
    # of the batch can be named.
    whole: bool = False

    def text(self) -> str:
        if self.kind == "layer":
            what = "its output" if self.phase == "forward" else "the gradient through it"
            return (f"layer '{self.name}' ({self.class_name}, computing in {self.dtype}): "
                    f"{what} is the first non-finite value")
        if self.kind == "input samples":
            verb = "is" if len(self.samples) == 1 else "are"
            return (f"the input batch: {_samples_at(self.samples)} of the epoch{self._rows()} "
                    f"{verb} not finite")
        if self.kind == "weights":
            return f"the weights after an update: {self.name} not finite"
        if self.kind == "loss":
            extra = (f" for {_samples_at(self.samples)} of the epoch{self._rows()}"
                     if self.samples else "")
            named = f" ({self.name})" if self.name else ""
            if self.whole:
                extra = (" as a whole (it returns one value for the batch, so no sample can be "
                         "named)")
            return f"the loss{named}: non-finite{extra} while every layer's output is finite"
        if self.kind == "unreplayed":
            return "not replayed: no batch of the failing step was kept"
        return "not found: the replay of the failing batch from these weights is finite"

    def _rows(self) -> str:
        if not (self.rows and self.data):
            return ""
        # More rows than samples: rows that hold the same values, which a sample is any of.
        if len(self.rows) > len(self.samples) == 1:
            return f" (any of {rows_in(self.rows, self.data)}: they hold the same values)"
        if len(self.rows) > len(self.samples):
            return f" ({rows_in(self.rows, self.data)}; some hold the same values)"
        return f" ({rows_in(self.rows, self.data)})"


@dataclass
class Diagnosis:
    headline: str                   # the fault, one line (app.numerics.rules.Fault)
    kind: str                       # the fault's kind
    step: int
    epoch: int
    policy: str
    where: Where
    verdict: str       # precision | data | optimizer | model | not reproduced | not replayed
    fix: str
    float32_finite: Optional[bool] = None
    largest_before: Optional[float] = None   # the largest finite magnitude going into it
    float32_largest: Optional[float] = None  # the same value computed in float32
    # For the --float32-layers flag: the whole set to give it, the layers the run computes in
    # float32 already (the flag's value replaces them) and the one found (``float32_set``).
    layers: List[str] = field(default_factory=list)
    replica: Optional[int] = None
    worker: Optional[int] = None
    seconds: Optional[float] = None
    # A layer's forward fault: overflow (a magnitude past the dtype's largest) or underflow
    # (a division by a value that is 0 in 16 bits), None when unknown; the op where it began.
    cause: Optional[str] = None
    inside_op: Optional[str] = None
    # An overflow inside the layer (``inside_op``): what that op's value reaches in float32.
    inside_float32_largest: Optional[float] = None
    # What went into the layer was too large for its 16-bit dtype before Keras cast it (a
    # float32 layer's output): its largest magnitude, and that layer (None: not a layer's,
    # the model's input say).
    cast_input_largest: Optional[float] = None
    cast_input_from: Optional[str] = None

    @property
    def flag(self) -> Optional[str]:
        return float32_layers.flag(self.layers) if self.layers else None

    def values_text(self) -> Optional[str]:
        if self.largest_before is None and self.float32_largest is None:
            return None
        limit = limits.largest(self.where.dtype or "float32")
        if self.cast_input_largest is not None:
            return self._cast_input(limit)
        parts = []
        if self.largest_before is not None:
            parts.append(f"the largest finite magnitude going in was {self.largest_before:.4g}")
        if self.cause == "underflow":
            reaches = ("" if self.float32_largest is None else
                       f"; in float32 the value reaches {self.float32_largest:.4g}")
            op = f" ({self.inside_op})" if self.inside_op else ""
            parts[-1:] = [f"{parts[-1] if parts else 'its inputs are finite'}{reaches}, far under "
                          f"{self.where.dtype}'s largest ({limit:g}): not an overflow, but a "
                          f"division{op} by a value that is 0 in {self.where.dtype}"]
        elif self.cause == "overflow" and self.inside_op:
            parts.append(self._overflow_inside(limit))
        elif self.float32_largest is not None:
            parts.append(f"in float32 the value reaches {self.float32_largest:.4g} "
                         f"({self.float32_largest / limit:.3g}x {self.where.dtype}'s "
                         f"largest, {limit:g})")
        else:
            parts.append(f"{self.where.dtype}'s largest finite value is {limit:g}")
        return "; ".join(parts)

    def _cast_input(self, limit: float) -> str:
        """What went in overflowed in Keras' cast to the layer's 16 bits, before its call."""
        dtype = self.where.dtype
        source = (f"the output of layer '{self.cast_input_from}'" if self.cast_input_from
                  else "its input")
        out = ("" if self.float32_largest is None else
               f"; in float32 this layer's output reaches {self.float32_largest:.4g}")
        return (f"what goes in ({source}, in float32) reaches {self.cast_input_largest:.4g}, "
                f"too large to cast to {dtype} ({self.cast_input_largest / limit:.3g}x "
                f"{dtype}'s largest, {limit:g}): Keras' cast of it for this layer is inf "
                f"before the layer computes anything{out}")

    def _overflow_inside(self, limit: float) -> str:
        """An op of the layer's call overflowed (its output stays in range in float32, so
        its own value says nothing): the op, and what its value reaches in float32."""
        dtype = self.where.dtype
        reaches = ("" if self.inside_float32_largest is None else
                   f": in float32 its value reaches {self.inside_float32_largest:.4g} "
                   f"({self.inside_float32_largest / limit:.3g}x {dtype}'s largest, {limit:g})")
        out = ("" if self.float32_largest is None else
               f", though the layer's output in float32 reaches only {self.float32_largest:.4g}")
        return f"inside the layer, {self.inside_op} overflows {dtype}{reaches}{out}"

    def lines(self, output: Optional[str] = None, command_line: bool = True) -> List[str]:
        """The console block: the first line is the error, the rest indented.  ``output``:
        the run's folder; ``command_line``: the run is ``tfmp train``'s (its words are
        flags), else ``app.train``'s (keywords)."""
        named = [f"{k} {v}" for k, v in (("replica", self.replica), ("worker", self.worker))
                 if v is not None]
        at = f" ({', '.join(named)})" if named else ""
        out = [f"error: training diverged at step {self.step} (epoch {self.epoch}){at}: "
               f"{self.headline}",
               f"  where it began: {self.where.text()}"]
        values = self.values_text()
        if values:
            out.append(f"  values: {values}")
        if self.float32_finite is not None:
            out.append("  float32: " + (
                "the same batch from the same weights is finite in float32: a precision problem"
                if self.float32_finite else
                "the same batch from the same weights is not finite in float32 either: "
                "not a precision problem"))
        out.append(f"  verdict: {self.verdict}")
        out.append(f"  fix: {self.fix}")
        out.append(f"  then: {self.then_text(output, command_line)} (docs/numerics.md)")
        return out

    def then_text(self, output: Optional[str] = None, command_line: bool = True) -> str:
        """What to run after the fix.  The checkpoint saved at the fault holds the weights
        the failing step began from: a resume from it works when the fix is in the data, a
        flag or the model, never when those weights are what went wrong (the optimizer's
        verdict): an update grew them (the guard stops only non-finite ones), and a lower
        learning rate cannot shrink them, so the run starts again (--resume takes only the
        newest checkpoint)."""
        resume = "--resume" if command_line else "resume=True"
        if self.verdict == "optimizer":
            new = "a new --output" if command_line else "a new output="
            if not output:
                gone = "after removing the run's folder"
            elif command_line:
                gone = f"after removing {output} (rm -r {shlex.quote(output)})"
            else:
                gone = f"after removing {output!r}"
            return (f"start the run again with the fix, with {new} or {gone}: the checkpoint "
                    f"saved at the fault holds the weights that grew, and {resume} would "
                    "continue from them")
        # The data is fixed outside the command (the rows in the file); any other fix is a
        # flag or an edit of the model, given with the resume.
        first = ("once those samples are fixed or removed in the data, the same command"
                 if self.where.kind == "input samples" else "the same command, with the fix,")
        if not command_line:
            first = first.replace("the same command", "the same app.train call")
        return f"{first} with {resume} continues from the checkpoint saved at the fault"

    def summary(self) -> str:
        """One line for metrics.json's ``diagnosis``: what happened, where, the fix."""
        return (f"step {self.step} (epoch {self.epoch}): {self.headline}; where it began: "
                f"{self.where.text()}; verdict: {self.verdict}; fix: {self.fix}")

    def to_json(self) -> dict:
        d = asdict(self)
        d["flag"] = self.flag
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Diagnosis":
        """``to_json``'s inverse (another worker's diagnosis, pooled)."""
        fields = {k: v for k, v in d.items() if k != "flag"}
        return cls(**{**fields, "where": Where(**fields["where"])})


def _samples_at(samples: List[int]) -> str:
    """'the sample at position 5', or 'samples at positions 5, 9 and 3 more'."""
    if len(samples) == 1:
        return f"the sample at position {samples[0]}"
    return "samples at positions " + listed(samples)




def float32_set(kept: Sequence[str], path: str) -> List[str]:
    """The layers to run in float32 once the layer at ``path`` is: the run's own float32
    layers ``kept`` (as the run names them: --float32-layers replaces them, so a flag naming
    the new one alone would put them back in 16 bits), then ``path`` unless one of them
    names it already (its full path, or its last parts)."""
    kept = list(kept)
    if any(path == name or path.endswith("/" + name) for name in kept):
        return kept
    return kept + [path]


def float32_words(paths: Sequence[str], command_line: bool = True) -> str:
    """The setting that runs ``paths`` in float32, in the words of what runs the run:
    ``--float32-layers a,b`` (``tfmp train``) or ``float32_layers=["a", "b"]``
    (``app.train``)."""
    if command_line:
        return float32_layers.flag(paths)
    return f"float32_layers=[{', '.join(json.dumps(p) for p in paths)}]"


def layer_fix(path: str, dtype: str, phase: str, epsilon: Optional[tuple] = None,
              cause: Optional[str] = None, kept: Sequence[str] = (),
              command_line: bool = True) -> str:
    """The fix for a layer whose 16-bit value is the cause.  ``epsilon``: (its attribute, or
    None for a constant written in its call, the value) that is 0 in ``dtype``; ``cause``:
    underflow (a division by a value 0 in 16 bits) or overflow, None when not known;
    ``kept``: the layers the run computes in float32 already (``float32_set``);
    ``command_line``: ``tfmp train``'s words (flags), else ``app.train``'s (keywords)."""
    flag = float32_words(float32_set(kept, path), command_line)
    holds = (f"{dtype}'s smallest normal is {limits.SMALLEST_NORMAL.get(dtype, 0):.2g}, its "
             f"smallest subnormal {limits.SMALLEST.get(dtype, 0):.2g}")
    if epsilon is not None:
        attr, value = epsilon
        what = (f"its {attr}={value:g}" if attr else
                f"the constant {value:g} in its call (an epsilon?)")
        return (f"{what} is 0 in {dtype} ({holds}): use an epsilon {dtype} can hold (1e-3 or "
                f"more), or run the layer in float32 without editing the model: {flag}")
    if cause == "underflow":
        return (f"it divides by a value that is 0 in {dtype} (an epsilon?): run the layer in "
                f"float32 without editing the model: {flag} (or dtype='float32' on it); or add "
                f"an epsilon {dtype} can hold ({holds}: 1e-3 or more) before it divides")
    if phase == "backward":
        return (f"its gradients overflow {dtype} even unscaled: run the layer in float32 "
                f"without editing the model: {flag} (or dtype='float32' on it), or clip its "
                "input")
    return (f"run the layer in float32 without editing the model: {flag} (or dtype='float32' "
            "on it); or keep its output in range: clip it, or rescale what goes in "
            "(normalise the inputs, a smaller initialiser)")


def cast_fix(path: str, dtype: str, source: Optional[str], largest: float,
             kept: Sequence[str] = (), command_line: bool = True) -> str:
    """The fix for a layer whose input, from ``source`` (a float32 layer, or None: the
    model's input), is past ``dtype``'s largest before Keras casts it to ``dtype``."""
    setting = float32_words(float32_set(kept, path), command_line)
    upstream = (f"the output of '{source}'" if source else "what goes into it (the model's "
                "input?)")
    return (f"run this layer in float32 too: {setting} (or dtype='float32' on it); or keep "
            f"{upstream} under {dtype}'s largest ({limits.largest(dtype):g}; it reaches "
            f"{largest:.4g}): scale or clip it")


def unreplayed(headline: str, kind: str, step: int, epoch: int, policy: str, *,
               command_line: bool = True, weights: Sequence[str] = (),
               fallback: str = "") -> Diagnosis:
    """The report of a fault with no batch to replay: a rule's over the step counters
    (``skipped``), or weights found non-finite between steps (``weights``: ``weights``
    names them), with the fix and what to run next in the words of what ran the run;
    ``fallback``: the fix for any other (a latched fault whose step kept no batch)."""
    learning_rate = "--learning-rate" if command_line else "learning_rate="
    if kind == "weights":
        return Diagnosis(headline, kind, step, epoch, policy,
                         Where("weights", name=", ".join(weights[:4]) or None), "optimizer",
                         f"an update sent the weights out of range: lower {learning_rate} (by "
                         "10x or more), or clip the gradients (clipnorm= on your optimizer)",
                         float32_finite=False)
    if kind != "skipped":
        return Diagnosis(headline, kind, step, epoch, policy, Where("unreplayed"),
                         "not replayed", fallback)
    find = (f"tfmp check --steps {step}" if command_line
            else f"app.check(model, data, steps={step})")
    in_float32 = "--float32-layers NAME" if command_line else "float32_layers=[NAME]"
    return Diagnosis(headline, kind, step, epoch, policy, Where("unreplayed"), "not replayed",
                     "the gradients stay non-finite at a loss scale of 1, where float16 "
                     f"gradients overflow unscaled: find the layer with `{find}` on the same "
                     f"data (it replays the failing batch layer by layer) and run it in float32 "
                     f"({in_float32}); or lower {learning_rate} (by 10x)")
