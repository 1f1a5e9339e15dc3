"""Importing the user's code: a file beside their model that stands in for a module a
library imports (an ``imp.py`` beside the model broke ``tfmp check`` deep inside
TensorFlow's flatbuffers) is named in one line; their own bug keeps its traceback."""
import sys

import pytest

from app.core.errors import UsageError, UserCodeError
from app.task import user_code

LIBRARY = "import tfmp_shadowed_abc\nVALUE = tfmp_shadowed_abc.needed()\n"


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """A library folder on the path (a library, and the module it imports) and the user's
    folder, whose own file has the name of the library's module."""
    lib, user = tmp_path / "lib", tmp_path / "user"
    lib.mkdir()
    user.mkdir()
    (lib / "tfmp_library_abc.py").write_text(LIBRARY)
    (lib / "tfmp_shadowed_abc.py").write_text("def needed():\n    return 1\n")
    (user / "tfmp_shadowed_abc.py").write_text("x = 1\n")
    monkeypatch.setattr(sys, "path", list(sys.path) + [str(lib)])
    yield lib, user
    for name in [n for n in sys.modules if n.startswith(("tfmp_shadowed_abc",
                                                         "tfmp_library_abc", "tfmp_user_"))]:
        sys.modules.pop(name, None)


def test_a_file_that_stands_in_for_a_librarys_module_is_one_line(folders):
    _, user = folders
    (user / "net.py").write_text("import tfmp_library_abc\n\ndef build():\n    pass\n")
    with pytest.raises(UsageError) as caught:
        user_code.load_object(str(user / "net.py") + ":build", "model")
    line = str(caught.value)
    assert "tfmp_shadowed_abc.py (module 'tfmp_shadowed_abc')" in line, line
    assert f"in {user} was imported in place of" in line and "AttributeError" in line
    assert caught.value.allowed.startswith("rename that file")


def test_a_module_the_users_code_imports_itself_is_theirs(folders):
    """Their own module of that name, imported on purpose: their bug, with its traceback."""
    _, user = folders
    (user / "net.py").write_text("import tfmp_shadowed_abc\ntfmp_shadowed_abc.needed()\n"
                                 "\ndef build():\n    pass\n")
    with pytest.raises(UserCodeError):
        user_code.load_object(str(user / "net.py") + ":build", "model")


def test_a_failing_import_without_such_a_file_is_the_users_bug(folders):
    _, user = folders
    (user / "tfmp_shadowed_abc.py").unlink()
    (user / "net.py").write_text("raise RuntimeError('the bucket is not mounted')\n")
    with pytest.raises(UserCodeError):
        user_code.load_object(str(user / "net.py") + ":build", "model")


@pytest.mark.parametrize("settings, line", [
    ({"model": "nets.py"}, "error: model 'nets.py' names a file but not the function in it; "
                           "allowed: nets.py:FUNCTION, e.g. nets.py:build"),
    ({"data": "./mydata.py"}, "error: dataset './mydata.py' names a file but not the function "
                              "in it; allowed: ./mydata.py:FUNCTION, e.g. ./mydata.py:load"),
    ({"data": "photos"}, "error: dataset 'photos' is a folder; allowed: --dataset images "
                         "--image-dir photos for a folder of one subfolder of images per class"),
    ({"env": "photos"}, "error: TFMP_DATASET 'photos' is a folder; allowed: --dataset images "
                        "--image-dir photos"),
])
def test_a_file_or_folder_given_as_a_spec_is_named_with_the_form_it_needs(
        tmp_path, monkeypatch, settings, line):
    """`--dataset ./mydata.py` (no function), `--dataset ./photos` (a folder of images):
    the usual slips are told what to write, not only that the value is not a built-in."""
    import app

    (tmp_path / "photos" / "cats").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as caught:
        if "env" in settings:   # the command line's path: flags, then TFMP_ variables
            from app.training.config import resolve_config

            resolve_config({"output": str(tmp_path / "run")},
                           {"TFMP_DATASET": settings["env"]})
        else:
            app.train(epochs=1, output=str(tmp_path / "run"), **settings)
    assert str(caught.value).startswith(line), str(caught.value)
    assert not (tmp_path / "run").exists()
