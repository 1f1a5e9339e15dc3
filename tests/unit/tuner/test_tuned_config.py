"""``train --tuned``: the tune's precision and batch size through the real configuration
order (flag > TFMP_ variable > tune.json > default), ``--scale-lr``, the "tuned" block of
metrics.json, and bad input (one line, exit 2, nothing written)."""
from __future__ import annotations

import json

import pytest

from app.training.config import resolve_config
from app.core.errors import UsageError
from app.tuner import report
from tests.unit.helpers import error_lines, run_app

GIB = 2**30


def _tune_json(tmp_path, model="mlp", dataset="synthetic", **over):
    doc = {"schema": report.SCHEMA, "task": {"model": model, "dataset": dataset},
           "budget_bytes": 2 * GIB, "margin": 0.1,
           "precisions": {"float32": {"max_batch": 512, "best_batch": 128},
                          "mixed_bfloat16": {"max_batch": 1024, "best_batch": 256}},
           "choice": {"precision": "mixed_bfloat16", "batch_size": 256,
                      "samples_per_second": 610.0},
           "verified": {"fits": True, "precision": "mixed_bfloat16", "batch_size": 256}}
    doc.update(over)
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def _resolve(flags, env=None):
    return resolve_config(dict({"model": "mlp", "dataset": "synthetic"}, **flags),
                          environ=env or {})


def test_the_tune_sets_precision_and_batch_and_is_recorded(tmp_path):
    cfg = _resolve({"tuned": _tune_json(tmp_path)})
    assert (cfg.precision, cfg.batch_size, cfg.learning_rate) == ("mixed_bfloat16", 256, 1e-3)
    rec = cfg.tuning
    assert rec["taken"] == ["precision", "batch_size"] and rec["overridden"] == {}
    assert rec["choice"]["batch_size"] == 256 and rec["scale_lr"] == "none"
    assert rec["learning_rate"] == {"before": 1e-3, "after": 1e-3, "update_batch": 256,
                                    "micro_batch": 256, "accumulate": 1,
                                    "update_batch_is_per_replica": True}
    assert "2x the 128" in rec["optimization_note"] and "--scale-lr linear" in rec["optimization_note"]
    assert "tuning" not in cfg.to_dict() and cfg.to_dict()["tuned"] == cfg.tuned


def test_the_tune_comes_from_tfmp_tuned_too(tmp_path):
    cfg = _resolve({}, {"TFMP_TUNED": _tune_json(tmp_path), "TFMP_SCALE_LR": "linear"})
    assert (cfg.precision, cfg.batch_size) == ("mixed_bfloat16", 256)
    assert cfg.learning_rate == pytest.approx(2e-3)


def test_flags_beat_the_tune(tmp_path):
    cfg = _resolve({"tuned": _tune_json(tmp_path), "batch_size": 64, "precision": "float32"})
    assert (cfg.precision, cfg.batch_size) == ("float32", 64)
    assert cfg.tuning["taken"] == []
    assert cfg.tuning["overridden"] == {"precision": {"tuned": "mixed_bfloat16", "used": "float32"},
                                        "batch_size": {"tuned": 256, "used": 64}}


def test_environment_beats_the_tune(tmp_path):
    cfg = _resolve({"tuned": _tune_json(tmp_path)}, {"TFMP_BATCH_SIZE": "32"})
    assert (cfg.precision, cfg.batch_size) == ("mixed_bfloat16", 32)
    assert cfg.tuning["taken"] == ["precision"]
    assert cfg.tuning["overridden"] == {"batch_size": {"tuned": 256, "used": 32}}


def test_linear_scaling_from_the_default_or_the_recorded_reference(tmp_path):
    cfg = _resolve({"tuned": _tune_json(tmp_path), "scale_lr": "linear", "learning_rate": 0.01})
    assert cfg.learning_rate == pytest.approx(0.02)
    assert cfg.tuning["learning_rate"] == {"before": 0.01, "after": pytest.approx(0.02),
                                           "update_batch": 256, "micro_batch": 256,
                                           "accumulate": 1,
                                           "update_batch_is_per_replica": True}
    assert "makes it 0.02" in cfg.tuning["optimization_note"]
    cfg = _resolve({"tuned": _tune_json(tmp_path, reference_batch_size=64),
                    "scale_lr": "linear", "learning_rate": 0.01})
    assert cfg.learning_rate == pytest.approx(0.04) and cfg.tuning["reference_batch_size"] == 64


def test_the_benchmark_resolution_ignores_the_tune(tmp_path):
    cfg = resolve_config({"model": "mlp", "dataset": "synthetic"},
                         environ={"TFMP_TUNED": _tune_json(tmp_path, model="resnet")},
                         use_tuned=False)
    assert (cfg.batch_size, cfg.tuned, cfg.tuning) == (128, None, None)


@pytest.mark.parametrize("flags,env,needle", [
    ({"scale_lr": "cubic"}, {}, "scale_lr must be one of none, linear"),
    ({}, {"TFMP_SCALE_LR": "linear"}, "applies with --tuned only"),
    ({"tuned": "TUNE", "model": "cnn"}, {}, "tuned for another job"),
    ({"tuned": "nope.json"}, {}, "does not exist"),
    # a tune.json cut short to its schema: not "tuned for another job (model None ...)"
    ({"tuned": "BARE"}, {}, "is not a usable tune file (it names no model and dataset it was "
                            "tuned for)"),
])
def test_bad_tuned_settings_are_usage_errors(tmp_path, flags, env, needle):
    from app.training.tuned import SCHEMA as TUNE_SCHEMA

    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"schema": TUNE_SCHEMA}), encoding="utf-8")
    flags = {k: (_tune_json(tmp_path) if v == "TUNE" else str(bare) if v == "BARE" else v)
             for k, v in flags.items()}
    with pytest.raises(UsageError) as err:
        _resolve(flags, env)
    assert needle in err.value.line() and "\n" not in err.value.line()


@pytest.mark.parametrize("args,env,needle", [
    (["--tuned", "DAMAGED"], {}, "not a usable tune file"),
    (["--tuned", "TUNE", "--model", "cnn"], {}, "tuned for another job"),
    ([], {"TFMP_TUNED": "TUNE", "TFMP_SCALE_LR": "quadratic"}, "TFMP_SCALE_LR"),
    (["--tuned", "TUNE", "--scale-lr", "quadratic"], {}, "invalid choice"),
])
def test_cli_bad_tune_input_is_one_line_exit_2_nothing_written(tmp_path, args, env, needle):
    tune = _tune_json(tmp_path)
    damaged = tmp_path / "damaged.json"
    damaged.write_text('{"schema": ', encoding="utf-8")
    subst = {"TUNE": tune, "DAMAGED": str(damaged)}
    args = [subst.get(a, a) for a in args]
    env = {k: subst.get(v, v) for k, v in env.items()}
    out = tmp_path / "run"
    proc = run_app("train", "--model", "mlp", "--dataset", "synthetic", *args,
                   "--output", str(out), "--workspace", str(tmp_path / "ws"), env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) <= 2   # argparse: usage + error
    assert needle in proc.stderr, proc.stderr
    assert not out.exists() and not (tmp_path / "ws").exists()
    if "invalid choice" not in needle:
        assert len(error_lines(proc.stderr)) == 1


@pytest.mark.host_only(reason="reads docker-compose.multiworker.yml, which the image does not "
                               "ship")
def test_the_multiworker_compose_file_passes_every_training_variable():
    """Its command is fixed, so a variable is the only way to give a setting: TFMP_ACCUMULATE,
    TFMP_GLOBAL_BATCH, TFMP_SEED and others never reached the workers, and nothing said so.
    TFMP_OUTPUT is the command's --output (runs/$MW_RUN)."""
    yaml = pytest.importorskip("yaml")
    from app.core import settings
    from tests.paths import ROOT

    with open(ROOT / "docker-compose.multiworker.yml", encoding="utf-8") as fh:
        compose = yaml.safe_load(fh)
    wanted = {s.env for s in settings.SETTINGS} - {"TFMP_OUTPUT"}
    for name in ("worker0", "worker1"):
        env = compose["services"][name]["environment"]
        assert wanted - set(env) == set(), name
        for var in wanted - {"TFMP_STRATEGY"}:   # the user's value, passed as it is
            assert str(env[var]).startswith(f"${{{var}:-"), (var, env[var])


@pytest.mark.host_only(reason="reads docker-compose.multiworker.yml, which the image does not "
                               "ship")
def test_the_multiworker_compose_file_leaves_a_tune_in_charge(tmp_path):
    # docker-compose.multiworker.yml passes its variables to both workers; with only
    # TFMP_TUNED given, precision and batch size must come from the tune (issue 24, item 11),
    # not from values the file sets itself.
    import re

    yaml = pytest.importorskip("yaml")
    from tests.paths import ROOT

    with open(ROOT / "docker-compose.multiworker.yml", encoding="utf-8") as fh:
        compose = yaml.safe_load(fh)
    user = {"TFMP_TUNED": _tune_json(tmp_path), "TFMP_SCALE_LR": "linear"}

    def interpolate(value):   # Compose's ${VAR:-default}
        return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: user.get(m.group(1)) or m.group(2),
                      str(value))

    for name in ("worker0", "worker1"):
        env = {k: interpolate(v) for k, v in compose["services"][name]["environment"].items()
               if k.startswith("TFMP_") and k != "TFMP_STRATEGY"}
        cfg = _resolve({}, env)
        assert (cfg.precision, cfg.batch_size) == ("mixed_bfloat16", 256), env
        assert cfg.tuning["taken"] == ["precision", "batch_size"]
        assert cfg.tuning["notes"] == [] and cfg.tuning["scale_lr"] == "linear"
    # a value the user sets still wins, as the note says
    user["TFMP_BATCH_SIZE"] = "32"
    env = {k: interpolate(v) for k, v in compose["services"]["worker0"]["environment"].items()
           if k.startswith("TFMP_") and k != "TFMP_STRATEGY"}
    cfg = _resolve({}, env)
    assert cfg.batch_size == 32 and "--batch-size 32 overrides the tuned 256" in cfg.tuning["notes"]


def test_a_precision_taken_from_the_tune_says_where_it_came_from(tmp_path):
    """The precision line said "(requested explicitly)" for the tune's choice."""
    from app.training.job import prepare

    small = {"tuned": _tune_json(tmp_path), "max_train_samples": 64, "max_val_samples": 16,
             "output": str(tmp_path / "run"), "workspace": str(tmp_path / "ws")}
    taken = prepare(_resolve(small))
    assert (taken.decision.policy, taken.decision.reason) == \
        ("mixed_bfloat16", "taken from the tune, --tuned")
    named = prepare(_resolve(dict(small, precision="float32")))
    assert (named.decision.policy, named.decision.reason) == ("float32", "requested explicitly")
    assert not (tmp_path / "run").exists()
