"""Which ``tf.distribute`` strategy a run uses, and who writes what.

The decision is a small pure function, ``choose_strategy(requested, gpu_count, cluster)``,
tested with fake hardware and fake ``TF_CONFIG`` values; ``setup()`` is the TensorFlow edge
that builds the chosen strategy.  It must run before TensorFlow creates its first tensor
(``MultiWorkerMirroredStrategy`` configures collective ops at start-up, and logical CPU
devices cannot be added later), so ``app.training.job.prepare`` calls it before loading data.

Batch sizes: ``--batch-size`` is per replica; the datasets are batched with the global batch
``batch_size * replicas`` and every replica gets its share.

Multi-worker roles follow TensorFlow's convention: the chief is task ``chief:0`` if the
cluster has one, else ``worker:0``.  Every worker runs the same program and takes part in
every save (saving may need collective reads), but only the chief writes into ``--output``;
the others write into ``<dir>/workertemp_<task>`` and delete it right away
(``write_dir``), as TensorFlow's multi-worker guide prescribes.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from app.core.errors import UsageError

STRATEGIES = ("auto", "one", "mirrored", "multi-worker")
TASK_TYPES = ("chief", "worker")
LOGICAL_CPUS_ENV = "TFMP_LOGICAL_CPUS"  # testing aid: split the CPU into N logical devices
_TF_CONFIG_ALLOWED = ('a JSON object {"cluster": {"chief"|"worker": ["host:port", ...]}, '
                      '"task": {"type": "chief"|"worker", "index": <int>}}, or unset')


@dataclass(frozen=True)
class Cluster:
    """What ``TF_CONFIG`` says (only the parts we need)."""
    workers: tuple[str, ...]          # every training task's address, chief first
    task_type: str
    task_index: int
    has_chief: bool

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def is_chief(self) -> bool:
        if self.has_chief:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def task(self) -> str:
        return f"{self.task_type}:{self.task_index}"

    @property
    def rank(self) -> int:
        """This task's place among the workers, the chief first (the collectives' order)."""
        if self.task_type == "chief":
            return 0
        return self.task_index + (1 if self.has_chief else 0)


def parse_tf_config(text: str | None) -> Cluster | None:
    """``TF_CONFIG`` -> Cluster; None when unset or empty.  Anything malformed is a
    UsageError naming TF_CONFIG (one line, exit 2)."""
    if text is None or not text.strip():
        return None

    def bad(why: str) -> UsageError:
        return UsageError(f"environment variable TF_CONFIG is not valid: {why}", _TF_CONFIG_ALLOWED)

    try:
        conf = json.loads(text)
    except ValueError as exc:
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(conf, dict):
        raise bad(f"expected a JSON object, got {type(conf).__name__}")
    cluster, task = conf.get("cluster"), conf.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise bad('missing or empty "cluster"')
    unknown = sorted(set(cluster) - set(TASK_TYPES))
    if unknown:
        # ps/evaluator belong to ParameterServerStrategy / side-car evaluation: not supported.
        raise bad(f'task type(s) {", ".join(unknown)} in "cluster" are not supported')
    for kind, addrs in cluster.items():
        if (not isinstance(addrs, list) or not addrs
                or not all(isinstance(a, str) and ":" in a for a in addrs)):
            raise bad(f'cluster "{kind}" must be a non-empty list of "host:port" strings')
        for a in addrs:
            # "host:${PORT}" with PORT unset: TensorFlow's own traceback ("Could not parse
            # port"), or, out of range, a worker that waits for ever without a word.
            host, _, port = a.rpartition(":")
            if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise bad(f'cluster "{kind}" address {a!r} is not "host:port" with a port '
                          "from 1 to 65535")
    if len(cluster.get("chief", [])) > 1:
        raise bad('a cluster has at most one "chief"')
    if not isinstance(task, dict):
        raise bad('missing "task"')
    ttype, index = task.get("type"), task.get("index", 0)
    if ttype not in cluster:
        raise bad(f'task type {ttype!r} is not in "cluster" ({", ".join(sorted(cluster))})')
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cluster[ttype]):
        raise bad(f'task index {index!r} is out of range for {len(cluster[ttype])} {ttype} task(s)')
    workers = tuple(cluster.get("chief", [])) + tuple(cluster.get("worker", []))
    return Cluster(workers=workers, task_type=ttype, task_index=index, has_chief="chief" in cluster)


@dataclass(frozen=True)
class StrategyChoice:
    kind: str        # one | mirrored | multi-worker
    reason: str


def choose_strategy(requested: str, gpu_count: int, cluster: Cluster | None) -> StrategyChoice:
    """The decision table (pure: no TensorFlow)."""
    if requested not in STRATEGIES:
        raise UsageError(f"strategy must be one of {', '.join(STRATEGIES)}. "
                         f"Received: strategy={requested!r}", ", ".join(STRATEGIES))
    if requested == "one":
        return StrategyChoice("one", "asked for one device")
    if requested == "mirrored":
        return StrategyChoice("mirrored", f"asked for mirrored ({gpu_count} GPU(s) visible)")
    if requested == "multi-worker":
        n = cluster.num_workers if cluster else 1
        return StrategyChoice("multi-worker", f"asked for multi-worker ({n} worker(s) in TF_CONFIG)"
                              if cluster else "asked for multi-worker (no TF_CONFIG: one worker)")
    if cluster is not None and cluster.num_workers > 1:
        return StrategyChoice("multi-worker",
                              f"TF_CONFIG describes a cluster of {cluster.num_workers} workers")
    if gpu_count > 1:
        return StrategyChoice("mirrored", f"{gpu_count} GPUs visible")
    return StrategyChoice("one", f"{gpu_count} GPU(s) visible and no multi-worker TF_CONFIG")


def parse_logical_cpus(environ: Mapping[str, str]) -> int | None:
    raw = environ.get(LOGICAL_CPUS_ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"environment variable {LOGICAL_CPUS_ENV}={raw!r} is not valid",
                         "an integer >= 1 (testing aid: split the CPU into N logical devices)")
    return n


def worker_temp_dir(dirpath: str, cluster: Cluster | None) -> str:
    """Where this task writes something that lives in ``dirpath`` on the chief."""
    if cluster is None or cluster.is_chief:
        return dirpath
    return os.path.join(dirpath, f"workertemp_{cluster.task_type}_{cluster.task_index}")


@dataclass
class Distribution:
    """The built strategy and what the run needs to know about it."""
    choice: StrategyChoice
    strategy: Any
    replicas: int
    per_replica_batch: int
    cluster: Cluster | None = None
    devices: list = field(default_factory=list)

    @property
    def global_batch(self) -> int:
        return self.per_replica_batch * self.replicas

    @property
    def is_chief(self) -> bool:
        return self.cluster is None or self.cluster.is_chief

    @property
    def multi_worker(self) -> bool:
        return self.choice.kind == "multi-worker"

    @property
    def spreads_batches(self) -> bool:
        """Each global batch is split between replicas or workers (the datasets distributed)."""
        return self.replicas > 1 or self.multi_worker

    def write_dir(self, dirpath: str) -> str:
        return worker_temp_dir(dirpath, self.cluster if self.multi_worker else None)

    def cleanup(self, path: str) -> None:
        """Remove a non-chief's temporary copy (never the chief's)."""
        if path and not self.is_chief and "workertemp_" in os.path.basename(path):
            shutil.rmtree(path, ignore_errors=True)

    def to_dict(self) -> dict:
        return {"strategy": self.choice.kind, "reason": self.choice.reason,
                "replicas": self.replicas, "devices": self.devices,
                "per_replica_batch": self.per_replica_batch, "global_batch": self.global_batch,
                "workers": self.cluster.num_workers if self.cluster else 1,
                "task": self.cluster.task if self.cluster else None,
                "is_chief": self.is_chief}

    def pool_json(self, value) -> list:
        """Every worker's ``value`` (JSON-able, or None), in worker order: one all-gather
        outside the step, for what each worker found alone (the sentinel's replay of its
        own batch).  Every worker must call it, as for any collective.  One worker: [value]."""
        if not self.multi_worker or self.cluster is None or self.cluster.num_workers < 2:
            return [value]
        return _gather_json(self.strategy, value)

    def describe(self) -> str:
        where = f", task {self.cluster.task} of {self.cluster.num_workers}" if self.cluster else ""
        role = "" if self.is_chief else " (not the chief: writes only temporary files)"
        return (f"strategy: {self.choice.kind} ({self.choice.reason}); {self.replicas} replica(s)"
                f"{where}{role}; batch {self.per_replica_batch} per replica, global batch "
                f"{self.global_batch}")


# ---- the TensorFlow edge ----------------------------------------------------------------------

_BUILT: dict = {}   # one strategy of each kind per process (TF allows MWMS to be made once)


def _split_cpu(tf, n: int) -> None:
    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if current is not None and len(current) == n:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
    except RuntimeError:
        raise UsageError(f"{LOGICAL_CPUS_ENV} must be set before TensorFlow starts (it is a "
                         "testing aid for new processes: tfmp train)",
                         f"{LOGICAL_CPUS_ENV} in the environment of a fresh process") from None


def build(kind: str, gpu_count: int, cluster: Cluster | None):
    """Create (or reuse) the strategy of ``kind``; returns (strategy, device names)."""
    import tensorflow as tf

    if kind in _BUILT:
        return _BUILT[kind]
    if kind == "one":
        strategy = tf.distribute.get_strategy()
        devices = []
    elif kind == "mirrored":
        if gpu_count:
            devices = [d.name for d in tf.config.list_logical_devices("GPU")]
        else:  # MirroredStrategy() alone would take only CPU:0; use every logical CPU
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        strategy = tf.distribute.MirroredStrategy(devices=devices)
    else:
        # Reads TF_CONFIG itself; validated above so TF never sees a malformed one.
        if cluster is not None:
            # Until every worker has started, TensorFlow waits without a word.
            print(f"multi-worker: {cluster.task_type} {cluster.task_index} of a cluster of "
                  f"{len(cluster.workers)} ({', '.join(cluster.workers)}); training starts "
                  "when every worker has joined", file=sys.stderr, flush=True)
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        devices = list(strategy.extended.worker_devices)
    _BUILT[kind] = (strategy, devices)
    return _BUILT[kind]


def setup(requested: str, per_replica_batch: int, gpu_count: int,
          environ: Mapping[str, str] | None = None) -> Distribution:
    """Validate TF_CONFIG, choose and build the strategy.  Call before any TF tensor exists."""
    environ = os.environ if environ is None else environ
    cluster = parse_tf_config(environ.get("TF_CONFIG"))
    choice = choose_strategy(requested, gpu_count, cluster)
    logical = parse_logical_cpus(environ)
    if logical:
        import tensorflow as tf

        _split_cpu(tf, logical)
    strategy, devices = build(choice.kind, gpu_count, cluster)
    if choice.kind != "multi-worker":
        cluster = None  # a TF_CONFIG that is not used does not change who writes
    return Distribution(choice=choice, strategy=strategy,
                        replicas=int(strategy.num_replicas_in_sync),
                        per_replica_batch=per_replica_batch, cluster=cluster, devices=devices)


POOL_BYTES = 1 << 16   # one worker's JSON at most; a longer one is sent as None


def _gather_json(strategy, value) -> list:
    """``pool_json``: each worker's JSON as a fixed-size int32 row (its length first), from the
    first local replica (the others send zeros), gathered by ``strategy.gather``."""
    import json

    import numpy as np
    import tensorflow as tf

    data = json.dumps(value).encode()
    if len(data) > POOL_BYTES:
        data = b"null"
    row = np.zeros(POOL_BYTES + 1, np.int32)
    row[0], row[1:1 + len(data)] = len(data), np.frombuffer(data, np.uint8)
    local = len(strategy.extended.worker_devices)

    def mine(ctx):
        first = ctx.replica_id_in_sync_group % local == 0
        return tf.constant(row if first else np.zeros_like(row))[None]
    rows = strategy.gather(strategy.experimental_distribute_values_from_function(mine), axis=0)
    out = []
    for r in rows.numpy():
        if r[0] > 0:
            out.append(json.loads(r[1:1 + r[0]].astype(np.uint8).tobytes().decode()))
    return out


def distribute_dataset(dist: Distribution, dataset):
    """Split each global batch between the replicas (and, multi-worker, between workers:
    the in-memory datasets here have no files to shard, so shard by data)."""
    if not dist.spreads_batches:
        return dataset
    return dist.strategy.experimental_distribute_dataset(shard_by_data(dataset))


def shard_by_data(dataset):
    """In-memory datasets have no files to shard by: shard by data, and say so once here
    instead of TensorFlow's warning per run."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)
