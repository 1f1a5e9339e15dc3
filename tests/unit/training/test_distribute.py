"""The strategy decision and TF_CONFIG checks (pure functions: no TensorFlow, no processes),
and bad input through the CLI (one line, exit 2, nothing written)."""
import json

import pytest

from app.training.distribute import (Cluster, Distribution, StrategyChoice, choose_strategy,
                                     parse_logical_cpus, parse_tf_config, worker_temp_dir)
from app.core.errors import UsageError

from tests.unit.helpers import error_lines, run_app


def tf_config(workers=2, chief=False, task=("worker", 0)):
    cluster = {"worker": [f"host{i}:2222" for i in range(workers)]}
    if chief:
        cluster["chief"] = ["boss:2222"]
    return json.dumps({"cluster": cluster, "task": {"type": task[0], "index": task[1]}})


TWO = parse_tf_config(tf_config(2))
SINGLE = parse_tf_config(tf_config(1))


@pytest.mark.parametrize("requested, gpus, cluster, kind", [
    ("auto", 0, None, "one"),
    ("auto", 1, None, "one"),
    ("auto", 2, None, "mirrored"),
    ("auto", 8, None, "mirrored"),
    ("auto", 0, TWO, "multi-worker"),
    ("auto", 4, TWO, "multi-worker"),       # a cluster wins: MWMS uses each worker's GPUs too
    ("auto", 0, SINGLE, "one"),              # a one-task TF_CONFIG is not a cluster
    ("auto", 2, SINGLE, "mirrored"),
    ("one", 4, TWO, "one"),
    ("mirrored", 0, None, "mirrored"),       # over logical CPU devices (testing)
    ("multi-worker", 0, None, "multi-worker"),
    ("multi-worker", 1, TWO, "multi-worker"),
])
def test_decision_table(requested, gpus, cluster, kind):
    choice = choose_strategy(requested, gpus, cluster)
    assert choice.kind == kind
    assert choice.reason  # always says why


def test_unknown_strategy_names_what_is_allowed():
    with pytest.raises(UsageError) as err:
        choose_strategy("horovod", 0, None)
    assert "auto, one, mirrored, multi-worker" in str(err.value) and "'horovod'" in str(err.value)


def test_tf_config_roles():
    assert parse_tf_config(None) is None and parse_tf_config("  ") is None
    w0, w1 = parse_tf_config(tf_config(2)), parse_tf_config(tf_config(2, task=("worker", 1)))
    assert (w0.num_workers, w0.is_chief, w1.is_chief) == (2, True, False)
    # with a chief task, worker 0 is not the chief
    c = parse_tf_config(tf_config(2, chief=True, task=("chief", 0)))
    w = parse_tf_config(tf_config(2, chief=True, task=("worker", 0)))
    assert (c.num_workers, c.is_chief, w.is_chief) == (3, True, False)
    assert c.workers[0] == "boss:2222"


@pytest.mark.parametrize("text, says", [
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"task": {"type": "worker", "index": 0}}', '"cluster"'),
    ('{"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}', "non-empty list"),
    ('{"cluster": {"worker": ["nohostport"]}, "task": {"type": "worker", "index": 0}}', "host:port"),
    # "host:${PORT}" with PORT unset, a typo, a port out of range: TensorFlow's traceback, or
    # a worker waiting for ever in silence
    ('{"cluster": {"worker": ["a:", "b:2"]}, "task": {"type": "worker", "index": 0}}',
     "address 'a:' is not \"host:port\" with a port from 1 to 65535"),
    ('{"cluster": {"worker": ["a:abc"]}, "task": {"type": "worker", "index": 0}}', "'a:abc'"),
    ('{"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker", "index": 0}}', "'a:99999'"),
    ('{"cluster": {"worker": [":2222"]}, "task": {"type": "worker", "index": 0}}', "':2222'"),
    ('{"cluster": {"worker": ["a:1"], "ps": ["b:1"]}, "task": {"type": "worker", "index": 0}}',
     "ps"),
    ('{"cluster": {"worker": ["a:1"]}}', '"task"'),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}', "not in"),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}',
     "out of range"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}}', "out of range"),
])
def test_malformed_tf_config_is_one_clear_error(text, says):
    with pytest.raises(UsageError) as err:
        parse_tf_config(text)
    line = err.value.line()
    assert line.startswith("error: environment variable TF_CONFIG is not valid")
    assert says in line and "allowed:" in line and "\n" not in line


def test_global_batch_and_write_paths(tmp_path):
    w1 = parse_tf_config(tf_config(2, task=("worker", 1)))
    d = Distribution(choice=StrategyChoice("multi-worker", "test"), strategy=None, replicas=4,
                     per_replica_batch=32, cluster=w1)
    assert d.global_batch == 128 and not d.is_chief
    assert d.to_dict()["global_batch"] == 128 and d.to_dict()["task"] == "worker:1"
    temp = d.write_dir(str(tmp_path / "ckpt"))
    assert temp == str(tmp_path / "ckpt" / "workertemp_worker_1")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "workertemp_worker_1").mkdir()
    d.cleanup(temp)
    assert not (tmp_path / "ckpt" / "workertemp_worker_1").exists()
    assert (tmp_path / "ckpt").exists()          # the chief's folder is never removed
    assert worker_temp_dir("/o", TWO) == "/o"    # worker 0 is the chief: writes in place
    assert worker_temp_dir("/o", None) == "/o"


def test_logical_cpus_testing_aid():
    assert parse_logical_cpus({}) is None
    assert parse_logical_cpus({"TFMP_LOGICAL_CPUS": "2"}) == 2
    for bad in ("0", "two", "-1"):
        with pytest.raises(UsageError, match="TFMP_LOGICAL_CPUS"):
            parse_logical_cpus({"TFMP_LOGICAL_CPUS": bad})


@pytest.mark.parametrize("args, env, says", [
    (["--strategy", "nccl"], {}, "strategy must be one of"),
    ([], {"TFMP_STRATEGY": "many"}, "TFMP_STRATEGY must be one of"),
    ([], {"TF_CONFIG": "{oops"}, "TF_CONFIG is not valid"),
    (["--strategy", "multi-worker"], {"TF_CONFIG": '{"cluster": {"ps": ["a:1"]}}'},
     "TF_CONFIG is not valid"),
    (["--strategy", "mirrored"], {"TFMP_LOGICAL_CPUS": "zero"}, "TFMP_LOGICAL_CPUS"),
])
def test_cli_bad_distribution_input(tmp_path, args, env, says):
    out = tmp_path / "run"
    proc = run_app("train", "--dataset", "synthetic", "--output", str(out), *args, env=env,
                   timeout=60)
    assert proc.returncode == 2
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and says in lines[0], proc.stderr[-800:]
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_cluster_is_hashable_value():
    # a frozen dataclass: safe to compare, to use as a key and to cache
    import dataclasses

    a, b = Cluster(("a:1",), "worker", 0, False), Cluster(("a:1",), "worker", 0, False)
    assert a == b and hash(a) == hash(b)
    assert len({a, b, Cluster(("a:1",), "worker", 1, False)}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.task_index = 1


@pytest.mark.host_only(reason="docs/ (the Kubernetes example) is not shipped in the image")
def test_kubernetes_example_is_an_indexed_job_with_a_headless_service():
    """docs/k8s/multiworker-job.yaml: parsed and checked for the parts that make it work
    (there is no cluster here to apply it to)."""
    import os

    from tests.paths import ROOT

    manifest = os.path.join(ROOT, "docs", "k8s", "multiworker-job.yaml")
    import yaml  # the test extra installs PyYAML

    with open(manifest) as fh:
        docs = {d["kind"]: d for d in yaml.safe_load_all(fh)}
    svc, job = docs["Service"], docs["Job"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == svc["metadata"]["name"] and pod["restartPolicy"] == "OnFailure"
    script = pod["containers"][0]["args"][-1]
    hosts = [f'{job["metadata"]["name"]}-{i}.{svc["metadata"]["name"]}:12345'
             for i in range(spec["completions"])]
    assert all(h in script for h in hosts) and "${JOB_COMPLETION_INDEX}" in script
    # the TF_CONFIG the script builds is valid for every index
    start = script.index('export TF_CONFIG="') + len('export TF_CONFIG="')
    template = script[start:script.index('"\n', start)].replace('\\"', '"')
    for i in range(spec["completions"]):
        cluster = parse_tf_config(template.replace("${JOB_COMPLETION_INDEX}", str(i)))
        assert cluster.num_workers == spec["completions"] and cluster.is_chief == (i == 0)
