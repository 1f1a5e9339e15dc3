"""A user's file with the name of one of Python's own modules (or of TensorFlow's), imported
in its place.

``python -m app`` puts the current folder first on ``sys.path`` (as ``python script.py``
puts the script's), so a ``glob.py`` or ``types.py`` there is what ``import glob`` finds,
for TensorFlow too: it then fails at import with a circular-import traceback, or trains
an epoch and dies at the first checkpoint (``module 'glob' has no attribute 'glob'``).
Both are named here in one line, before anything runs (the console script ``tfmp`` puts
its own folder first instead).  Only when such a file exists (otherwise this is a listing
of one folder) is TensorFlow imported early, to see which of them took a module's place:
a ``test.py`` that nothing imports is left alone.
"""
from __future__ import annotations

import functools
import os
import sys
import sysconfig
from typing import List, Optional, Tuple

from app.core.errors import UsageError


@functools.lru_cache(maxsize=None)
def stdlib_names() -> frozenset:
    """The top-level names of Python's standard library (3.10+ lists them; before that, the
    standard library's folders are read)."""
    listed = getattr(sys, "stdlib_module_names", None)
    if listed:
        return frozenset(listed)
    names = set(sys.builtin_module_names)
    stdlib = sysconfig.get_paths()["stdlib"]
    for folder in (stdlib, os.path.join(stdlib, "lib-dynload")):
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            if entry.endswith(".py"):
                names.add(entry[:-3])
            elif entry.endswith(".so"):
                names.add(entry.split(".", 1)[0])
            elif os.path.isfile(os.path.join(folder, entry, "__init__.py")):
                names.add(entry)
    names.discard("site-packages")
    return frozenset(names)


# What TensorFlow itself is made of and imports first: a keras.py or numpy.py of one's own
# (a common name for a first experiment) breaks it the same way.
TENSORFLOWS_OWN = frozenset({"tensorflow", "keras", "numpy", "absl", "google", "h5py",
                             "tensorboard", "ml_dtypes", "wrapt", "gast", "opt_einsum"})


def namesakes(folder: str) -> List[Tuple[str, str]]:
    """(file, module) for each module file or package in ``folder`` whose name is one of
    Python's own modules, or of the packages TensorFlow is made of."""
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return []
    std = stdlib_names() | TENSORFLOWS_OWN
    out = []
    for entry in entries:
        path = os.path.join(folder, entry)
        name = entry[:-3] if entry.endswith(".py") else entry
        if name in std and name != "__main__" and (
                entry.endswith(".py") or os.path.isfile(os.path.join(path, "__init__.py"))):
            out.append((entry, name))
    return out


def user_folder() -> Optional[str]:
    """The folder ``python -m`` put first on ``sys.path`` (the current one), else None (a
    console script's first entry is its own bin folder)."""
    first = sys.path[0] if sys.path else None
    if first in ("", os.getcwd()):
        return os.getcwd()
    return None


def refuse_namesakes(folder: Optional[str]) -> None:
    """UsageError when a file in ``folder`` took the place of one of Python's modules in
    TensorFlow's import, or broke that import."""
    if folder is None:
        return
    found = namesakes(folder)
    if not found:
        return
    allowed = "rename the file, or run from another folder"
    try:
        import tensorflow  # noqa: F401  - the import a namesake breaks
    except Exception as exc:   # whatever the namesake made of it
        files = ", ".join(f for f, _ in found)
        raise UsageError(f"TensorFlow failed to import ({type(exc).__name__}: {exc}), with "
                         f"{files} in {folder}, named like a module it imports, first on "
                         "the import path", allowed) from None
    taken = [(f, name) for f, name in found
             if _from(sys.modules.get(name), os.path.join(folder, f))]
    if taken:
        f, name = taken[0]
        whose = "Python's own" if name in stdlib_names() else "TensorFlow's"
        raise UsageError(f"{os.path.join(folder, f)} was imported in place of {whose} "
                         f"module {name!r} (the current folder comes first on the import "
                         "path)", allowed)


def _from(module, path: str) -> bool:
    origin = getattr(module, "__file__", None)
    if not origin:
        return False
    origin = os.path.abspath(origin)
    return origin == os.path.abspath(path) or origin.startswith(os.path.abspath(path) + os.sep)
