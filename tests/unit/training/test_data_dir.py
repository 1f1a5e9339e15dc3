"""A data folder the user named must exist, whatever the dataset (docs/training.md: "An
explicit --data-dir must exist"), and the line names the setting as given: ``--data-dir
/nope --dataset synthetic`` trained (rc 0), and ``TFMP_DATA_DIR=/nope`` was called
"data directory ... (or omit --data-dir)", a flag the user never typed."""
from __future__ import annotations

import pytest

from app import cli
from app.core.errors import UsageError
from app.training.config import resolve_config


@pytest.mark.parametrize("dataset", ["synthetic", "mnist"])
def test_a_named_data_folder_that_is_not_there_is_refused_for_every_dataset(tmp_path, dataset):
    with pytest.raises(UsageError) as err:
        resolve_config({"dataset": dataset, "data_dir": str(tmp_path / "nope")}, {})
    assert err.value.line().startswith(f"error: --data-dir '{tmp_path / 'nope'}' does not exist")


def test_a_variable_is_named_as_the_variable(tmp_path):
    with pytest.raises(UsageError) as err:
        resolve_config({}, {"TFMP_DATA_DIR": str(tmp_path / "nope"), "TFMP_DATASET": "mnist"})
    line = err.value.line()
    assert line.startswith(f"error: TFMP_DATA_DIR '{tmp_path / 'nope'}' does not exist"), line
    assert "--data-dir" not in line


def test_a_file_is_not_a_folder_and_a_folder_or_the_default_is_taken(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        resolve_config({"data_dir": str(tmp_path / "f")}, {})
    assert resolve_config({"data_dir": str(tmp_path)}, {}).data_dir == str(tmp_path)
    # the workspace's own data folder need not exist yet: a download makes it
    cfg = resolve_config({"workspace": str(tmp_path / "ws")}, {})
    assert cfg.data_dir == str(tmp_path / "ws" / "data")


def test_tfmp_train_refuses_it_in_one_line_before_anything_is_written(tmp_path, capsys):
    rc = cli.main(["train", "--dataset", "synthetic", "--data-dir", str(tmp_path / "nope"),
                   "--workspace", str(tmp_path / "ws")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "does not exist" in err, err
    assert not (tmp_path / "ws").exists()
