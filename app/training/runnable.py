"""Which policy a model trains in on this machine: the one asked for, or, for ``auto``,
the one it picked unless this TensorFlow cannot run one of the model's layers under it
here (``app.machine.kernels``), when auto falls back to float32 and says why.  ``train``
decides it in ``prepare``; ``tfmp check`` asks the same, so that its auto is train's."""
from __future__ import annotations

import tensorflow as tf

from app.core.errors import PrecisionUnsupported, UsageError, UserCodeError
from app.precision import policy as prec
from app.task.task import Task


def runnable_when_built(decision: prec.PrecisionDecision, task: Task, bundle
                        ) -> prec.PrecisionDecision:
    """``auto`` never picks a policy it would refuse: a user's model, whose layers it cannot
    know before it is built (``runnable_by_kinds`` checks the built-ins'), is built once under
    mixed_bfloat16, its layers checked, run on two samples (a custom layer's op may have no
    bfloat16 kernel) and thrown away; refused, auto falls back to float32 and says why.
    Keras' state is cleared after, so the model built for training gets the layer names
    ``check`` and ``--float32-layers`` use."""
    from app.machine import kernels

    if decision.requested != "auto" or decision.policy != kernels.PROBED_POLICY or \
            task.model.builtin:
        return decision
    before = prec.global_policy_name()
    prec.apply_policy(decision.policy)
    try:
        task.check_runnable(bundle)
    except PrecisionUnsupported as exc:
        return _fall_back(decision, exc.what)
    except (UsageError, UserCodeError):
        pass   # the build for training reports it, under the policy it runs
    finally:
        prec.apply_policy(before)
        tf.keras.backend.clear_session()
    return decision


def auto_runnable(decision: prec.PrecisionDecision, task: Task, bundle, hw
                  ) -> prec.PrecisionDecision:
    """What ``auto`` trains this model in here, as ``train`` decides it: the policy it
    picked, or float32 with the reason when the model has a layer that policy cannot run
    (a built-in's by its layer kinds, a user's by building it).  ``tfmp check`` asks the
    same, so that its auto is train's."""
    return runnable_when_built(runnable_by_kinds(decision, task.model.spec, hw), task, bundle)


def runnable_by_kinds(decision: prec.PrecisionDecision, model: str, hw
                      ) -> prec.PrecisionDecision:
    """A built-in model's layer kinds are known (``app.core.catalog``): a policy this TensorFlow
    cannot run here for one of them is one line before any data loads (``app.machine.kernels``;
    a user's model is checked in ``Task.build``, once built).  ``auto`` falls back to
    float32 and says why: for a built-in model when one of its kinds cannot run (the mlp's
    Dense layers still run in bfloat16 with oneDNN off), and for a user's model, whose kinds
    are not known yet, where oneDNN is off on TF 2.9 (no bfloat16 convolutions at all)."""
    from app.machine import kernels
    from app.core import catalog as registry

    if decision.policy != kernels.PROBED_POLICY:
        return decision
    auto = decision.requested == "auto"
    kinds = registry.layer_kinds(model)
    if kinds is None:
        if auto:
            sup = kernels.support(decision.policy, hw)
            if sup.failing and (sup.everything or (sup.onednn is not None
                                                   and not sup.onednn[0])):
                cause = next(iter(sup.failing.values())).text("convolutions")
                return _fall_back(decision, cause)
        return decision
    try:
        kernels.check_kinds(decision.policy, kinds, model, hw)
    except PrecisionUnsupported as exc:
        if not auto:
            raise
        return _fall_back(decision, exc.what)
    return decision


def _fall_back(decision: prec.PrecisionDecision, why: str) -> prec.PrecisionDecision:
    """``auto``'s choice given up for float32, with the reason it could not be kept."""
    from app.core import catalog as registry

    return prec.PrecisionDecision(registry.BASELINE_POLICY, f"{decision.reason}, but {why}",
                                  requested="auto")

