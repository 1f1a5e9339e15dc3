"""When skipped or non-finite steps are a fault, read off the step counters.  No TensorFlow.

Loss scaling skips a step now and then and lowers the scale: that is how it works, and it
is never an alarm (the count goes into metrics.json).  A fault is
* ``forward``: a step's loss was not finite (a non-finite value in the forward pass, which
  loss scaling cannot help: it scales the backward pass only; a run without loss scaling
  is told so without that clause);
* ``gradients``: non-finite gradients without loss scaling (float32, mixed_bfloat16);
* ``floor``: the loss scale reached its floor and steps are still skipped;
* ``skipped``: more steps in a row skipped than ``--max-skipped-steps``, the loss scale at its
  floor now (the older rule, ``--no-sentinel``'s too; with the sentinel the floor's latch
  comes first unless the limit is under ``FLOOR_PATIENCE``);
* ``weights``: a weight is not finite (an update that overflowed).
The first three are latched inside the training step (``app.training.sentinel``), at the
step they happen, and from then on no update reaches the weights.

A run of skipped steps above the floor is never a fault, however long: each skip halves
the scale, so a run that has not reached the floor is the scale still coming down from a
start too high for this model (2^40 takes ~23 halvings to fit), which is loss scaling
working as designed.  Only the run still going at the floor is counted against the limit,
and one that has ended (the scale recovered) is not counted at all.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

# The loss scale's floor: Keras 2 never lowers it under 1; Keras 3 would go on halving, but
# a float16 gradient that overflows at scale 1 overflows unscaled: nothing left to recover.
FLOOR = 1.0
# Steps in a row skipped at the floor before it is a fault (one can be a transient spike).
FLOOR_PATIENCE = 3

# The latch's codes inside the step (int64 variable): 0 means none.
KIND_CODES = {1: "forward", 2: "gradients", 3: "floor"}
CODE_OF = {v: k for k, v in KIND_CODES.items()}


@dataclass(frozen=True)
class Counters:
    """The step counters as the monitor reads them between steps."""
    step: int               # steps so far
    fault_step: int         # the step the latch was set at, -1 when none
    fault_code: int         # KIND_CODES, 0 when none
    fault_scale: float      # the loss scale at the latched step
    run_start: int          # the first step of the latest run of skipped steps
    skipped_total: int      # steps loss scaling skipped (expected)
    worst_run: int          # the longest run of skipped steps since the last check
    in_a_row: int = 0       # steps skipped in a row up to now (0: the latest step was not)


@dataclass(frozen=True)
class Fault:
    kind: str               # forward | gradients | floor | skipped | weights
    step: int               # the step it began at
    headline: str           # what happened, one line
    loss_scale: float = 1.0  # the scale the failing step ran with (the replay uses it)
    # ``skipped``: the run's length and --max-skipped-steps, for its words as the user gave
    # the setting (``in_words``).
    in_a_row: int = 0
    limit: Optional[int] = None

    def in_words(self, command_line: bool) -> "Fault":
        """This fault with its headline naming settings as ``tfmp train`` (flags) or
        ``app.train`` (keywords) takes them."""
        if self.limit is None:
            return self
        return replace(self, headline=skipped_headline(
            self.step - self.in_a_row + 1, self.in_a_row, self.limit, command_line))


def headline(kind: str, *, policy: str = "", run_start: int = 0,
             loss_scaled: bool = True) -> str:
    """What a latched fault of ``kind`` means, in one line (train and check say the same);
    ``loss_scaled``: the run scales its loss (else no word of loss scaling)."""
    if kind == "forward":
        if not loss_scaled:
            return "the loss was not finite (a non-finite value in the forward pass)"
        return ("the loss was not finite (a non-finite value in the forward pass, which loss "
                "scaling cannot help)")
    if kind == "gradients":
        return f"non-finite gradients under {policy}, which has no loss scaling to recover with"
    return (f"the loss scale reached its floor ({FLOOR:g}); every step since step {run_start} "
            "was skipped")


def stuck_at_floor(in_a_row: int, loss_scale_now: float, max_skipped_steps: int) -> bool:
    """More than ``max_skipped_steps`` steps in a row skipped, the run still going and the
    loss scale at its floor: a run above the floor is the scale coming down, and one that
    ended is the scale recovered (the module's docstring)."""
    return in_a_row > max_skipped_steps and loss_scale_now <= FLOOR


def skipped_headline(run_start: int, in_a_row: int, limit: int, command_line: bool = True) -> str:
    """The ``skipped`` rule's words, naming --max-skipped-steps as the run took it."""
    setting = f"--max-skipped-steps {limit}" if command_line else f"max_skipped_steps={limit}"
    return (f"the loss scale reached its floor ({FLOOR:g}); every step since step {run_start} "
            f"was skipped ({in_a_row} in a row, more than {setting})")


def fault(c: Counters, *, loss_scaled: bool, policy: str, max_skipped_steps: int,
          loss_scale_now: float) -> Optional[Fault]:
    """The fault these counters show, or None.  A headline says what happened; the
    diagnosis puts the step and epoch in front of it."""
    kind = KIND_CODES.get(c.fault_code)
    if kind is not None:
        return Fault(kind, c.fault_step, headline(kind, policy=policy, run_start=c.run_start,
                                                  loss_scaled=loss_scaled), c.fault_scale)
    if loss_scaled and stuck_at_floor(c.in_a_row, loss_scale_now, max_skipped_steps):
        return Fault("skipped", c.step,
                     skipped_headline(c.step - c.in_a_row + 1, c.in_a_row, max_skipped_steps),
                     loss_scale_now, in_a_row=c.in_a_row, limit=max_skipped_steps)
    return None


def weights_fault(step: int) -> Fault:
    return Fault("weights", step, "the weights are not finite (an update overflowed them)")
