"""The output folders a user names: checked before any work, made with one line on refusal
(app/core/folders.py; no TensorFlow)."""
import errno
import os

import pytest

from app.core import folders
from app.core.errors import UsageError


def _line(info) -> str:
    return info.value.line().removeprefix("error: ")


def test_a_folder_under_a_file_cannot_be_created_and_nothing_is_made(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(UsageError) as info:
        folders.check_writable(str(blocker / "run"))
    assert _line(info) == (f"output directory '{blocker / 'run'}' cannot be created: "
                           f"'{blocker}' is not a directory; allowed: a writable directory path")
    folders.check_writable(str(tmp_path / "new" / "run"))   # creatable: fine
    assert not (tmp_path / "new").exists()                  # ...and nothing created


@pytest.mark.parametrize("depth", ["the folder itself", "a folder above it"])
def test_a_link_to_nothing_on_the_way_is_named_with_its_target(tmp_path, depth):
    """runs -> /mnt/gone (a volume not mounted today): os.makedirs said "No such file or
    directory: 'runs/a'" about the folder it was asked to make, in a traceback."""
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "gone")
    path = link if depth == "the folder itself" else link / "a" / "b"
    for call in (folders.check_writable, folders.make_folder):
        with pytest.raises(UsageError) as info:
            call(str(path), "notebook folder")
        assert _line(info) == (
            f"notebook folder '{path}' cannot be created: '{link}' is a link to "
            f"'{tmp_path / 'gone'}', which does not exist (a volume or folder that is not "
            "there now?); allowed: a writable directory path, or a link to an existing folder")
    assert not (tmp_path / "gone").exists() and os.listdir(tmp_path) == ["runs"]


def test_a_link_to_an_existing_folder_is_followed(tmp_path):
    (tmp_path / "disk").mkdir()
    (tmp_path / "runs").symlink_to(tmp_path / "disk")
    folders.make_folder(str(tmp_path / "runs" / "a"))
    assert (tmp_path / "disk" / "a").is_dir()


def test_a_folder_that_denies_writing(tmp_path, monkeypatch):
    """Mode 0500 as the user (root, as CI runs the host's tests, passes every permission
    check, so the check's own question is answered no here)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(folders.os, "access",
                        lambda path, mode: os.path.abspath(path) != str(locked))
    for path in (locked, locked / "run"):   # existing and to be made
        with pytest.raises(UsageError) as info:
            folders.make_folder(str(path))
        assert _line(info) == (f"output directory '{path}' is not writable ('{locked}' "
                               "denies writing); allowed: a writable directory path")
    assert os.listdir(locked) == []


def test_what_the_check_cannot_foresee_is_still_one_line(tmp_path, monkeypatch):
    """Root passes os.access on /proc, and a folder can go between the check and the
    write: the creation's own OSError becomes the line, with the part it names."""
    def refuse(path, exist_ok=False):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "/proc/x")
    monkeypatch.setattr(folders.os, "makedirs", refuse)
    with pytest.raises(UsageError) as info:
        folders.make_folder(str(tmp_path / "run"))
    assert _line(info) == (f"output directory '{tmp_path / 'run'}' cannot be created: No such "
                           "file or directory ('/proc/x'); allowed: a writable directory path")


def test_an_existing_writable_folder_is_left_as_it_is(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    folders.make_folder(str(tmp_path))
    assert (tmp_path / "keep.txt").read_text() == "mine"
