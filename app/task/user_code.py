"""User code named on the command line: ``MODULE:OBJECT`` or ``path/to/file.py:OBJECT``.

``load_object(spec, what)`` imports the module (a dotted name importable from the current
directory or ``PYTHONPATH``, or a ``.py`` file by path) and returns the named object.
``call_user(fn, spec, available)`` calls a user function with only the parameters it
declares, taken from ``available``.

Two kinds of failure, kept apart on purpose:

* the spec is wrong (no such file, module or function; a parameter we cannot give; a wrong
  return type): ``UsageError``, one line naming the spec, exit status 2;
* the user's own code raised: ``UserCodeError``, which keeps the original exception and
  its traceback (it is their bug, they need the line), exit status 1.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable, Mapping

from app.core.errors import UsageError, UserCodeError

SPEC_FORMS = "a built-in name, MODULE:FUNCTION (dotted module) or path/to/file.py:FUNCTION"


def is_user_spec(spec: str) -> bool:
    """A spec names user code when it has the ``:`` of ``MODULE:OBJECT``."""
    return isinstance(spec, str) and ":" in spec


def misread_spec(what: str, spec: str, said: str | None = None) -> UsageError | None:
    """The one line for a ``what`` ("model" or "dataset") spec that names a file or folder the
    way users mistype it: a .py file without its function, or a folder of images given as
    the dataset.  ``said``: the setting as the user gave it (a TFMP_ variable)."""
    if not isinstance(spec, str) or ":" in spec:
        return None
    said = said or what
    if spec.endswith(".py"):
        example = "build" if what == "model" else "load"
        return UsageError(f"{said} {spec!r} names a file but not the function in it",
                          f"{spec}:FUNCTION, e.g. {spec}:{example}")
    if what == "dataset" and os.path.isdir(os.path.expanduser(spec)):
        return UsageError(f"{said} {spec!r} is a folder",
                          f"--dataset images --image-dir {spec} for a folder of one subfolder "
                          "of images per class (image_dir= in Python), a .npz file of arrays, "
                          "or MODULE:FUNCTION")
    return None


def not_a_spec(what: str, spec, builtins, said: str | None = None,
               files: str = "") -> UsageError:
    """The one line for a ``what`` spec that is neither a built-in nor ``MODULE:FUNCTION``
    (``misread_spec``'s when it is a usual slip); ``files``: the file suffix the spec may
    also take (a dataset's ``.npz``)."""
    misread = misread_spec(what, spec, said)
    if misread is not None:
        return misread
    said = said or what
    forms = f", MODULE:FUNCTION or a {files} file" if files else " or MODULE:FUNCTION"
    also = f", path/to/data{files}" if files else ""
    return UsageError(f"{said} must be one of {', '.join(builtins)}{forms}. "
                      f"Received: {said}={spec!r}",
                      f"{', '.join(builtins)}, MODULE:FUNCTION, path/to/file.py:FUNCTION{also}")


def split_spec(spec: str, what: str) -> tuple[str, str]:
    module, _, name = spec.rpartition(":")
    if not module or not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise UsageError(f"{what} spec {spec!r} is not MODULE:FUNCTION",
                         f"{SPEC_FORMS}, e.g. mymodels:build or ./nets/small.py:build")
    return module, name


def _is_path(module: str) -> bool:
    return module.endswith(".py") or os.sep in module or "/" in module


def _import_file(path: str, spec: str, what: str):
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise UsageError(f"{what} spec {spec!r}: file {path!r} does not exist",
                         "an existing .py file, relative to the current directory "
                         f"({os.getcwd()}) or absolute")
    # A stable module name per file, so a second load (resume, check then train) reuses it.
    digest = hashlib.sha1(full.encode()).hexdigest()[:10]
    mod_name = f"tfmp_user_{os.path.splitext(os.path.basename(full))[0]}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    loader_spec = importlib.util.spec_from_file_location(mod_name, full)
    if loader_spec is None or loader_spec.loader is None:
        raise UsageError(f"{what} spec {spec!r}: {path!r} cannot be imported", "a .py file")
    module = importlib.util.module_from_spec(loader_spec)
    # The file's own folder first on sys.path: its sibling modules import as they would
    # when the user runs the file themselves.
    folder = os.path.dirname(full)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[mod_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[mod_name]
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        _refuse_shadowing(folder, spec, what, exc)
        raise UserCodeError(spec, f"importing {path}", exc) from exc
    return module


def shadowing_modules(folder: str) -> list[tuple[str, str]]:
    """(name, file) of the modules imported from ``folder`` in place of another's: a
    ``random.py`` or ``imp.py`` beside the user's model, found first because the model's
    folder leads sys.path, and imported by a library (TensorFlow imports ``imp``) that wanted
    Python's own.  A module the folder's own code imports is the user's, on purpose."""
    import importlib.machinery

    folder = os.path.realpath(folder)
    elsewhere = [p for p in sys.path if p and os.path.realpath(p) != folder]
    found = []
    for name, mod in list(sys.modules.items()):
        file = getattr(mod, "__file__", None)
        if "." in name or not file or name.startswith("tfmp_user_"):
            continue
        top = os.path.dirname(os.path.realpath(file))
        if os.path.basename(file) == "__init__.py":
            top = os.path.dirname(top)
        if (top == folder and not _imported_by_folder(folder, name)
                and importlib.machinery.PathFinder.find_spec(name, elsewhere) is not None):
            found.append((name, file))
    return sorted(found)


def _imported_by_folder(folder: str, name: str, most: int = 200) -> bool:
    """Does a .py file of ``folder`` (its first ``most``) import ``name`` itself?"""
    import re

    pattern = re.compile(rf"^\s*(import|from)\s+{re.escape(name)}\b", re.MULTILINE)
    try:
        files = sorted(f for f in os.listdir(folder) if f.endswith(".py"))[:most]
    except OSError:
        return False
    for f in files:
        try:
            with open(os.path.join(folder, f), encoding="utf-8", errors="replace") as fh:
                if pattern.search(fh.read()):
                    return True
        except OSError:
            continue
    return False


def _refuse_shadowing(folder: str, spec: str, what: str, exc: BaseException) -> None:
    """An import that failed because a file of the user's folder stood in for a library's
    module is one line naming the file, not a traceback deep in that library."""
    shadows = shadowing_modules(folder)
    if not shadows:
        return
    files = ", ".join(f"{os.path.basename(f) if os.path.basename(f) != '__init__.py' else n}"
                      f" (module {n!r})" for n, f in shadows)
    raise UsageError(f"{what} spec {spec!r}: importing it failed ({type(exc).__name__}: "
                     f"{str(exc)[:160]}) because {files} in {folder} was imported in place of "
                     "the module of that name that Python or a library needs",
                     "rename that file (and its __pycache__), or keep your code in a folder "
                     "without it") from None


def current_folder_importable() -> None:
    """Put the current folder on sys.path, as the docs promise for MODULE specs.

    ``python -m app`` has it there already; the ``tfmp`` script, the benchmark's child runs
    (app/core/launch.py) and a Python API caller (a notebook, a script elsewhere) may not."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def _import_module(name: str, spec: str, what: str):
    current_folder_importable()
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        # Missing is the spec's fault only when the missing module is the one named (or a
        # parent package of it); a missing import *inside* their module is their bug.
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise UsageError(f"{what} spec {spec!r}: no module named {exc.name!r} on the Python "
                             f"path (current directory {os.getcwd()})",
                             f"{SPEC_FORMS}; run from the folder that holds the module, add it "
                             "to PYTHONPATH, or give the .py file's path") from None
        _refuse_shadowing(os.getcwd(), spec, what, exc)
        raise UserCodeError(spec, f"importing {name}", exc) from exc
    except Exception as exc:
        _refuse_shadowing(os.getcwd(), spec, what, exc)
        raise UserCodeError(spec, f"importing {name}", exc) from exc


def load_object(spec: str, what: str) -> Any:
    """The object named by ``spec`` (``what``: "model", "dataset", "loss", "metric")."""
    module_part, name = split_spec(spec, what)
    module = (_import_file(module_part, spec, what) if _is_path(module_part)
              else _import_module(module_part, spec, what))
    if not hasattr(module, name):
        public = sorted(n for n, v in vars(module).items()
                        if callable(v) and not n.startswith("_")
                        and getattr(v, "__module__", None) == module.__name__)
        raise UsageError(f"{what} spec {spec!r}: {module_part!r} has no {name!r}",
                         "one of the functions and classes it defines: "
                         + (", ".join(public) or "(it defines none)"))
    return getattr(module, name)


def source_file(obj: Any) -> str | None:
    """Where a user object was defined (recorded in metrics.json)."""
    try:
        return inspect.getsourcefile(obj)
    except TypeError:
        return None


def call_user(fn: Callable, spec: str, what: str, available: Mapping[str, Any]) -> Any:
    """Call ``fn`` with the parameters it declares, taken by name from ``available``.

    A parameter without a default that we cannot give is a spec error (exit 2) raised
    before the call; anything ``fn`` itself raises is a ``UserCodeError``.
    """
    if not callable(fn):
        raise UsageError(f"{what} spec {spec!r} names a {type(fn).__name__}, not a function",
                         f"a function taking any of: {', '.join(available)}")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: pass nothing
        params = {}
    kwargs: dict = {}
    for p in params.values():
        if p.kind is p.VAR_KEYWORD:
            kwargs.update(available)
            continue
        if p.kind is p.VAR_POSITIONAL:
            continue
        if p.name in available and p.kind is not p.POSITIONAL_ONLY:
            kwargs[p.name] = available[p.name]
        elif p.default is p.empty:
            raise UsageError(f"{what} spec {spec!r}: the function's parameter {p.name!r} has "
                             "no value we can give",
                             f"parameters named {', '.join(available)} (any subset), or "
                             "defaults for the others")
    try:
        return fn(**kwargs)
    except (UsageError, UserCodeError):
        raise
    except Exception as exc:
        raise UserCodeError(spec, f"calling {getattr(fn, '__name__', spec)}", exc) from exc


def parse_input_shape(text, name: str = "input_shape") -> tuple | None:
    """``name``: the setting as the user gave it (``TFMP_INPUT_SHAPE``, say)."""
    if text is None or isinstance(text, tuple):
        return text
    if isinstance(text, (list,)):
        return tuple(int(v) for v in text)
    # Every part a number: "8,x" (a slip for 8,8) must not be read as the shape (8,).
    try:
        shape = tuple(int(p) for p in str(text).replace("x", ",").split(","))
    except ValueError:
        shape = ()
    if not shape or any(d < 1 for d in shape):
        raise UsageError(f"{name} must be positive integers separated by commas. "
                         f"Received: {name}={text!r}", "e.g. 28,28,1 (or 28x28x1) or 784")
    return shape
