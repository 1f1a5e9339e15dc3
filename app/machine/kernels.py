"""Which layer kinds this TensorFlow can run here under a dtype policy.

TensorFlow 2.9 has bfloat16 CPU kernels for only some ops.  Without oneDNN (Eigen's
kernels) it has them for matrix products, embeddings and max pooling, and none for any
convolution, average pooling (its gradient), batch or layer normalization; it turns oneDNN
on by default only on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX.  With oneDNN
(which needs AVX-512 for bfloat16) the convolutions run, but Conv3D, DepthwiseConv2D and
SeparableConv2D still have no bfloat16 gradient.  Measured with TF 2.9.3 on the stand-in
base: ``TF_ENABLE_ONEDNN_OPTS=0`` on an AVX-512 CPU reproduces a CPU without AVX-512, and
oneDNN limited to AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``) crashes in the first bfloat16 MatMul.

Two halves, like ``app.machine.hardware``:

* a pure rule, ``expected_failures(policy, machine)``: from the TensorFlow version, the CPU
  flags and ``TF_ENABLE_ONEDNN_OPTS``, the kinds that cannot run and *why* in words;
* the edge, ``support(policy)``: a probe that runs one small layer of every kind forward and
  backward on tiny tensors, with the policy given to the layers themselves (the global
  policy is left alone), once per process.  The probe decides; the rule explains, and
  answers alone where probing would crash the process.

``check_kinds`` (a built-in model's kinds, from ``app.core.catalog``, before any data loads)
and ``app.task.model_layers.check_model`` (a user's model, right after its build function
returns) raise ``app.core.errors.PrecisionUnsupported``: one line naming the cause and what
works, exit 2.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from app.core.errors import PrecisionUnsupported, unprefixed
from app.machine import no_kernel

# The only policy probed: float32 and float16 have CPU kernels for every kind here (TF 2.9.3,
# oneDNN on and off, measured), and on GPUs float16 is what TensorFlow's kernels serve first.
PROBED_POLICY = "mixed_bfloat16"
PROBED_DTYPE = "bfloat16"  # its compute dtype

# The kinds probed, named by the Keras class that stands for them.
KINDS: Tuple[str, ...] = (
    "Dense", "Embedding", "Conv1D", "Conv2D", "Conv2DTranspose", "Conv3D", "DepthwiseConv2D",
    "SeparableConv2D", "AveragePooling2D", "MaxPooling2D", "BatchNormalization",
    "LayerNormalization", "LSTM", "GRU",
)
# Keras classes (matched by name along a layer's class hierarchy, so a user's subclass of
# Conv2D is a Conv2D) and the kind whose kernels they run.
CLASS_KINDS: Dict[str, str] = {
    **{k: k for k in KINDS},
    "EinsumDense": "Dense",
    "Conv1DTranspose": "Conv2DTranspose", "Conv3DTranspose": "Conv3D",
    "DepthwiseConv1D": "DepthwiseConv2D", "SeparableConv1D": "SeparableConv2D",
    "AveragePooling1D": "AveragePooling2D", "MaxPooling1D": "MaxPooling2D",
    "SyncBatchNormalization": "BatchNormalization",
}

# ---- the rule (pure) ------------------------------------------------------------------------

# TF 2.9 turns oneDNN on by default on Linux for CPUs with any of these (tensorflow/core/
# util/util.cc, IsMKLEnabled); TF_ENABLE_ONEDNN_OPTS overrides it either way.
ONEDNN_DEFAULT_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
                        "amx_bf16")
# oneDNN's bfloat16 needs AVX-512 (avx512_core; emulated there, native with AVX512_BF16).
AVX512_CORE = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
# TF 2.9 without oneDNN: the kinds with a bfloat16 CPU kernel forward and backward.
EIGEN_BF16_KINDS = ("Dense", "Embedding", "MaxPooling2D")
# TF 2.9 with oneDNN: no bfloat16 gradient on any CPU.
NO_BF16_GRADIENT = ("Conv3D", "DepthwiseConv2D", "SeparableConv2D")
# Keras 2.9's LSTM and GRU, traced (a training step is), build cuDNN's fused RNN op beside
# the generic loop and pick one when the step runs; that op takes float16, float32 or
# float64, so a bfloat16 layer fails as it is traced, with oneDNN or without.  Eager calls
# work, so the probe traces these kinds.  A layer that cannot use cuDNN (recurrent_dropout,
# an activation other than tanh, unroll) builds only the generic loop, which runs.
CUDNN_RNN = ("LSTM", "GRU")

WORKS = "a CPU with AVX-512 (VNNI or BF16) or AMX, or a GPU from Ampere on"
ALLOWED = f"--precision float32, or mixed_bfloat16 on {WORKS}"


@dataclass(frozen=True)
class Machine:
    """What the rule reads: the TensorFlow version, the CPU's flags (``/proc/cpuinfo``),
    ``TF_ENABLE_ONEDNN_OPTS`` and ``ONEDNN_MAX_CPU_ISA`` as set (None: unset) and the
    number of visible GPUs."""
    tensorflow: str
    cpu_flags: frozenset = frozenset()
    onednn_env: Optional[str] = None
    gpus: int = 0
    onednn_isa: Optional[str] = None

    @property
    def tf29(self) -> bool:
        return self.tensorflow == "2.9" or self.tensorflow.startswith("2.9.")

    @property
    def avx512(self) -> bool:
        return all(f in self.cpu_flags for f in AVX512_CORE)

    @property
    def isa_capped(self) -> bool:
        """ONEDNN_MAX_CPU_ISA keeps oneDNN below AVX-512 (SSE41, AVX, AVX2...)."""
        isa = (self.onednn_isa or "").strip().upper()
        return bool(isa) and not isa.startswith(("AVX512", "AVX10", "ALL"))

    @property
    def onednn_avx512(self) -> bool:
        """oneDNN may use AVX-512 here: the CPU has it and ONEDNN_MAX_CPU_ISA allows it."""
        return self.avx512 and not self.isa_capped


@dataclass(frozen=True)
class Cause:
    """Why a kind cannot run under the policy here (``{what}``: the layer type, filled in
    by ``text``), and what works instead."""
    why: str
    allowed: str = ALLOWED

    def text(self, what: str) -> str:
        return self.why.replace("{what}", what)


CUDNN_RNN_CAUSE = Cause(
    "Keras 2.9 builds cuDNN's fused RNN op beside the generic loop of {what} when traced, and "
    "that op takes float16, float32 or float64, not bfloat16 (on any CPU or GPU)",
    "--precision float32, or mixed_float16 on a GPU, or an LSTM or GRU that cannot use cuDNN "
    "(recurrent_dropout > 0, unroll=True, or an activation other than tanh)")


def onednn(m: Machine) -> Tuple[bool, str]:
    """Whether TensorFlow 2.9 runs oneDNN here, and why, in words."""
    env = (m.onednn_env or "").strip().lower()
    if env in ("0", "false"):
        return False, "TF_ENABLE_ONEDNN_OPTS=0 turns it off"
    if env in ("1", "true"):
        return True, "TF_ENABLE_ONEDNN_OPTS=1 turns it on"
    has = [f.upper() for f in ONEDNN_DEFAULT_FLAGS if f in m.cpu_flags]
    if has:
        return True, f"on by default: the CPU has {', '.join(has)}"
    return False, ("off by default: TensorFlow 2.9 turns it on only on CPUs with AVX512_VNNI, "
                   "AVX512_BF16, AVX_VNNI or AMX, and this CPU has none of them")


def probe_is_safe(policy: str, m: Machine) -> bool:
    """False where running bfloat16 math would crash the process (oneDNN on, no AVX-512)."""
    return not (policy == PROBED_POLICY and m.tf29 and not m.gpus and onednn(m)[0]
                and not m.onednn_avx512)


def expected_failures(policy: str, m: Machine) -> Optional[Dict[str, Cause]]:
    """The kinds the rule expects to fail under ``policy`` on ``m``, each with its cause;
    None where there is no rule (another policy, another TensorFlow, a GPU)."""
    if policy != PROBED_POLICY or m.gpus or not m.tf29:
        return None
    on, why_onednn = onednn(m)
    if on and not m.onednn_avx512:
        lacks = (f"ONEDNN_MAX_CPU_ISA={m.onednn_isa} keeps it off AVX-512" if m.isa_capped
                 else "this CPU lacks AVX-512")
        cause = Cause("TensorFlow 2.9 computes bfloat16 on this CPU through oneDNN ("
                      f"{why_onednn}), whose bfloat16 needs AVX-512, and {lacks}: bfloat16 "
                      "math crashes the process here, whatever the layer type",
                      ALLOWED + (" (or unset TF_ENABLE_ONEDNN_OPTS and ONEDNN_MAX_CPU_ISA)"
                                 if m.onednn_env is not None or m.isa_capped else ""))
        return {k: cause for k in KINDS}
    if on:
        cause = Cause("TensorFlow 2.9 has no bfloat16 gradient kernel for {what} on a CPU "
                      "(with oneDNN or without)",
                      "--precision float32, or mixed_bfloat16 on a GPU from Ampere on")
        return {**{k: cause for k in NO_BF16_GRADIENT}, **_cudnn_rnn()}
    if m.onednn_env is not None and m.avx512:
        tail, allowed = (f"and {why_onednn}",
                         "--precision float32, or mixed_bfloat16 without TF_ENABLE_ONEDNN_OPTS=0")
    elif m.avx512:
        tail, allowed = ("and this CPU's AVX-512 has neither VNNI nor BF16, so TensorFlow 2.9 "
                         "leaves oneDNN off",
                         "--precision float32, or mixed_bfloat16 with TF_ENABLE_ONEDNN_OPTS=1 "
                         f"(oneDNN emulates bfloat16 on AVX-512), or on {WORKS}")
    else:
        tail, allowed = ("and this CPU lacks AVX-512"
                         + (f" ({why_onednn})" if m.onednn_env is not None else ""), ALLOWED)
    cause = Cause("TensorFlow 2.9 has bfloat16 CPU kernels for {what} only in oneDNN, "
                  "which it turns on only on CPUs with AVX-512 (VNNI or BF16) or AMX, "
                  + tail, allowed)
    return {**{k: cause for k in KINDS if k not in EIGEN_BF16_KINDS + CUDNN_RNN},
            **_cudnn_rnn()}


def _cudnn_rnn() -> Dict[str, Cause]:
    return {k: CUDNN_RNN_CAUSE for k in CUDNN_RNN}


def kind_of(layer) -> Optional[str]:
    """The kind whose kernels ``layer`` runs (along its class hierarchy), or None.  An LSTM
    or GRU that Keras 2 will not run on cuDNN (``_could_use_gpu_kernel`` false) builds only
    its generic loop: of no probed kind."""
    if getattr(layer, "_could_use_gpu_kernel", True) is False:
        return None
    for cls in type(layer).__mro__:
        kind = CLASS_KINDS.get(cls.__name__)
        if kind:
            return kind
    return None


# ---- what the probe found -------------------------------------------------------------------

@dataclass(frozen=True)
class Support:
    """Which kinds ``policy`` can run here.  ``failing``: kind -> cause; ``errors``: what the
    probe's layer of that kind raised; ``everything``: the policy cannot run at all."""
    policy: str
    failing: Mapping[str, Cause] = field(default_factory=dict)
    probed: bool = False
    errors: Mapping[str, str] = field(default_factory=dict)
    onednn: Optional[Tuple[bool, str]] = None
    everything: bool = False

    def runs(self, kind: str) -> bool:
        return kind not in self.failing

    def to_dict(self) -> dict:
        return {"policy": self.policy, "probed": self.probed,
                "runs": [k for k in KINDS if self.runs(k)],
                "fails": {k: {"why": c.text(k), "allowed": c.allowed,
                              "error": self.errors.get(k)} for k, c in self.failing.items()},
                # One entry per cause, for people: the layer types it stops, in words.
                "causes": [{"kinds": ks, "why": c.text("these layer types"), "allowed": c.allowed}
                           for c, ks in self._by_cause()],
                "everything_fails": self.everything,
                "onednn": ({"on": self.onednn[0], "why": self.onednn[1]}
                           if self.onednn is not None else None)}

    def _by_cause(self) -> List[Tuple[Cause, List[str]]]:
        groups: Dict[Cause, List[str]] = {}
        for kind, cause in self.failing.items():
            groups.setdefault(cause, []).append(kind)
        return list(groups.items())

    @classmethod
    def from_dict(cls, d: Mapping) -> "Support":
        """The inverse of ``to_dict`` (``tfmp env --json``, read by benchmark and tune)."""
        fails = d.get("fails") or {}
        dnn = d.get("onednn")
        return cls(d.get("policy", PROBED_POLICY),
                   {k: Cause(v.get("why", ""), v.get("allowed", ALLOWED)) for k, v in fails.items()},
                   bool(d.get("probed")),
                   {k: v.get("error") for k, v in fails.items() if v.get("error")},
                   (bool(dnn.get("on")), str(dnn.get("why"))) if dnn else None,
                   bool(d.get("everything_fails")))


def reconcile(policy: str, m: Machine, probe_errors: Optional[Mapping[str, str]]) -> Support:
    """The rule's words for what the probe found (``probe_errors``: kind -> error, the kinds
    that failed; None when the probe could not run safely, then the rule alone)."""
    rule = expected_failures(policy, m) or {}
    dnn = onednn(m) if (policy == PROBED_POLICY and m.tf29 and not m.gpus) else None
    if probe_errors is None:
        return Support(policy, dict(rule), False, {}, dnn, everything=True)
    failing = {}
    for kind, error in probe_errors.items():
        failing[kind] = rule.get(kind) or Cause(
            f"TensorFlow {m.tensorflow} has no {PROBED_DTYPE} kernel for {{what}} here (a tiny "
            f"{kind} failed forward or backward: {error})")
    return Support(policy, failing, True, dict(probe_errors), dnn)


def _refusal(support: Support, what: str, kinds: Sequence[str],
             or_else: str = "") -> PrecisionUnsupported:
    first, also = kinds[0], kinds[1:]   # distinct: the callers pass dict.fromkeys(...)
    cause = support.failing[first]
    more = f" (also {', '.join(also)})" if also else ""
    return PrecisionUnsupported(support.policy, f"{support.policy} cannot run {what}{more} "
                                f"here: {cause.text(first)}", cause.allowed + or_else, kinds)


def refusal_for_kinds(support: Support, kinds: Iterable[str],
                      model: str) -> Optional[PrecisionUnsupported]:
    """For a built-in model (its kinds recorded in ``app.core.catalog``)."""
    bad = [k for k in dict.fromkeys(kinds) if not support.runs(k)]
    if not bad:
        return None
    return _refusal(support, f"the {bad[0]} layers of model {model!r}", bad)


def refusal_for_layers(support: Support, layers: Sequence[Tuple[str, str, Optional[str]]],
                       model: str) -> Optional[PrecisionUnsupported]:
    """``layers``: (path, class name, kind or None) of the layers computing in the policy's
    dtype.  A layer of no probed kind (a custom or an elementwise one) is refused only when
    the policy cannot run at all here."""
    if support.everything:
        bad = [(p, c, k or KINDS[0]) for p, c, k in layers[:1]]
    else:
        bad = [(p, c, k) for p, c, k in layers if k is not None and not support.runs(k)]
    if not bad:
        return None
    path, cls, _ = bad[0]
    where = f" of model {model!r}" if model else ""
    paths = list(dict.fromkeys(p for p, _, _ in bad))
    or_else = ""
    if len(paths) <= FEW_LAYERS and not support.everything:
        # A few layers (an LSTM among Dense ones): those in float32, the rest in 16 bits.
        those = "that layer" if len(paths) == 1 else "those layers"
        or_else = (f", or --float32-layers {','.join(paths)} ({those} in float32, the rest in "
                   f"{no_kernel.POLICY_DTYPES.get(support.policy, support.policy)})")
    return _refusal(support, f"layer {path!r} ({cls}){where}",
                    list(dict.fromkeys(k for _, _, k in bad)), or_else)


def builtin_refusals(model: str, env: Mapping) -> Dict[str, PrecisionUnsupported]:
    """{policy: refusal} for a built-in model whose layer kinds (``app.core.catalog``) a probed
    policy cannot run, read from a ``tfmp env --json`` report (``precision_support``): how
    ``tune`` and ``benchmark`` leave a policy out without importing TensorFlow.  {} for a
    user's model (its kinds are known once it is built)."""
    from app.core import catalog as registry

    kinds = registry.layer_kinds(model)
    out: Dict[str, PrecisionUnsupported] = {}
    for policy, d in ((env or {}).get("precision_support") or {}).items():
        refusal = refusal_for_kinds(Support.from_dict(d), kinds, model) if kinds else None
        if refusal is not None:
            out[policy] = refusal
    return out


REFUSAL = " cannot run "
FEW_LAYERS = 3   # refused layers a --float32-layers fix names; more is a model of that kind


def refused_policy(line: Optional[str]) -> Optional[str]:
    """The policy a ``PrecisionUnsupported`` line (with or without its ``error:``) refuses,
    else None: how the benchmark tells a refused policy from other bad input in a run's log."""
    text = unprefixed(line)
    return next((policy for policy in no_kernel.POLICY_DTYPES if text.startswith(f"{policy}{REFUSAL}")),
                None)


# ---- the edge: asks TensorFlow ----------------------------------------------------------------

def this_machine(hw=None) -> Machine:
    import tensorflow as tf

    from app.machine import hardware

    flags = hw.cpu_flags if hw is not None else hardware.read_cpu_flags()
    gpus = len(hw.gpus) if hw is not None else len(tf.config.list_physical_devices("GPU"))
    return Machine(tf.__version__, frozenset(flags), os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                   gpus, os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA"))


def _probe_layer(kind: str, policy: str):
    """A small layer of ``kind`` under ``policy`` and its input.  Constant initialisers
    and explicit names: no random op and no automatic layer name is used up, so the seeded
    weights and the names of the model built afterwards are what they would be without it."""
    import tensorflow as tf

    L, one = tf.keras.layers, "ones"
    kw = {"dtype": policy, "name": f"tfmp_probe_{kind.lower()}"}
    img, seq = (1, 6, 6, 2), (1, 6, 2)
    made = {
        "Dense": lambda: (L.Dense(2, kernel_initializer=one, **kw), (1, 3)),
        "Embedding": lambda: (L.Embedding(4, 2, embeddings_initializer=one, **kw), None),
        "Conv1D": lambda: (L.Conv1D(2, 3, kernel_initializer=one, **kw), seq),
        "Conv2D": lambda: (L.Conv2D(2, 3, kernel_initializer=one, **kw), img),
        "Conv2DTranspose": lambda: (L.Conv2DTranspose(2, 3, kernel_initializer=one, **kw), img),
        "Conv3D": lambda: (L.Conv3D(2, 3, kernel_initializer=one, **kw), (1, 4, 4, 4, 2)),
        "DepthwiseConv2D": lambda: (L.DepthwiseConv2D(3, depthwise_initializer=one, **kw), img),
        "SeparableConv2D": lambda: (L.SeparableConv2D(2, 3, depthwise_initializer=one,
                                                      pointwise_initializer=one, **kw), img),
        "AveragePooling2D": lambda: (L.AveragePooling2D(2, **kw), img),
        "MaxPooling2D": lambda: (L.MaxPooling2D(2, **kw), img),
        "BatchNormalization": lambda: (L.BatchNormalization(**kw), img),
        "LayerNormalization": lambda: (L.LayerNormalization(**kw), (1, 3)),
        "LSTM": lambda: (L.LSTM(2, kernel_initializer=one, recurrent_initializer=one, **kw),
                         seq),
        "GRU": lambda: (L.GRU(2, kernel_initializer=one, recurrent_initializer=one, **kw), seq),
    }
    return made[kind]()


def _first_line(exc: BaseException) -> str:
    from app.precision.dtype_clash import first_line

    return f"{type(exc).__name__}: {no_kernel.line(exc, PROBED_DTYPE) or first_line(exc)}"[:240]


def refusal_from_error(exc: BaseException, model: str,
                       layers: Sequence[Tuple[str, str]] = (),
                       policy: str = PROBED_POLICY) -> Optional[PrecisionUnsupported]:
    """A model failed under ``policy`` (mixed_bfloat16 or mixed_float16), as its build
    function made it, on its first batch or in its first training step, because an op takes
    no 16-bit input here (Keras 2's LSTM and GRU as they are traced, an op of a custom or an
    augmentation layer with no kernel for the dtype): the refusal naming the layer, the cause
    and what works, instead of "your code raised" or a traceback; None for any other error.
    ``layers``: the model's (path, class name) pairs, to name the layer of an error that
    gives only its class (Keras 3) or its node (an op inside a training step)."""
    dtype = no_kernel.POLICY_DTYPES.get(policy)
    line = no_kernel.line(exc, dtype) if dtype else None
    if line is None:
        return None
    text = str(exc)
    name, cls = no_kernel.called_layer(text)
    by_class: Dict[str, str] = {}
    for path, class_name in layers:
        by_class.setdefault(class_name, path)
    if not name:
        name = by_class.get(cls, "") or no_kernel.node_layer(text, [path for path, _ in layers])
        cls = cls or dict(layers).get(name, "")
    kind = CLASS_KINDS.get(cls)
    if policy == PROBED_POLICY and kind is not None:
        sup = support(PROBED_POLICY)
        if not sup.runs(kind):
            return refusal_for_layers(sup, [(name, cls, kind)], model)
    where = (f"layer {name!r} ({cls})" if name and cls else f"layer {name!r}" if name
             else f"a layer of class {cls}" if cls else "a layer")
    op = no_kernel.op_of(line, dtype)
    why = (f"TensorFlow has no {dtype} kernel for its op {op} here" if op
           else f"one of its ops takes no {dtype} ({line})")
    if op and dtype == "float16" and not _gpus():
        # mixed_float16 is a GPU's policy: its kernels cover ops a CPU's do not.
        why += (" (on this CPU; a GPU's kernels may have it: run check there before you "
                "change the model)")
    in_float32 = (f"--float32-layers {name} (that layer in float32, the rest in {dtype})"
                  if name else "that layer with dtype='float32'")
    return PrecisionUnsupported(policy, f"{policy}{REFUSAL}{where} of model {model!r}: {why}",
                                f"--precision float32, or {in_float32}",
                                [kind] if kind else [])


def _gpus() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def probe(policy: str, kinds: Sequence[str] = KINDS) -> Dict[str, str]:
    """Run a small layer of each kind forward and backward (its weights and its input)
    under ``policy``; the kinds that failed, each with its error."""
    import tensorflow as tf

    failed: Dict[str, str] = {}
    for kind in kinds:
        try:
            layer, shape = _probe_layer(kind, policy)
            x = tf.constant([[1, 2]]) if shape is None else tf.ones(shape)
            layer(x)   # built eagerly: a traced call cannot make the variables
            step = tf.function(_forward_backward) if kind in CUDNN_RNN else _forward_backward
            for g in step(layer, x, shape is not None):
                if g is not None:
                    tf.convert_to_tensor(g).numpy()   # run it: errors surface here
        except Exception as exc:   # what TensorFlow raises differs by kind and version
            failed[kind] = _first_line(exc)
    return failed


def _forward_backward(layer, x, watch: bool):
    """The gradients of the layer's summed output for its weights (and its input)."""
    import tensorflow as tf

    with tf.GradientTape() as tape:
        if watch:
            tape.watch(x)
        loss = tf.reduce_sum(tf.cast(layer(x, training=True), tf.float32))
    return tape.gradient(loss, list(layer.trainable_variables) + ([x] if watch else []))


_CACHE: Dict[str, Support] = {}


def support(policy: str, hw=None) -> Support:
    """Which kinds ``policy`` runs here; probed once per process (and policy)."""
    if policy != PROBED_POLICY:
        return Support(policy)
    if policy not in _CACHE:
        m = this_machine(hw)
        _CACHE[policy] = reconcile(policy, m, probe(policy) if probe_is_safe(policy, m)
                                   else None)
    return _CACHE[policy]


def check_kinds(policy: str, kinds: Iterable[str], model: str, hw=None) -> None:
    """A built-in model's kinds (``app.core.catalog``) under ``policy``: raise the refusal."""
    if policy != PROBED_POLICY:
        return
    refusal = refusal_for_kinds(support(policy, hw), kinds, model)
    if refusal is not None:
        raise refusal


def supports(probe_now: bool = True, hw=None) -> Dict[str, Support]:
    """What ``support`` knows for the probed policies: probed now when ``probe_now``,
    else only what this process has probed already (a float32 run probes nothing)."""
    if probe_now:
        support(PROBED_POLICY, hw)
    return dict(_CACHE)
