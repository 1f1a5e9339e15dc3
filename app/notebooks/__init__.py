"""The guide notebooks shipped with the package, and seeding them into a workspace.

The ``.ipynb`` files in this folder are package data (``pip install .`` carries them; the
image copies ``app/`` whole).  ``install(target)`` puts them into a user's folder:

* a notebook missing from ``target`` is copied (so deleting one gets a fresh copy back);
* a copy that is still byte-for-byte what an earlier version shipped is refreshed to the
  current version;
* a notebook the user changed (edited, run and saved, or a file of theirs with the same
  name) is never touched.

What was shipped is remembered in ``target/.tfmp-notebooks.json`` (file name -> sha256 of
the bytes written).  Every file is written under a temporary name and renamed, so a crash
leaves no half-written notebook.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from app.core import folders
from app.core.files import write_atomic

SOURCE_DIR = Path(__file__).resolve().parent
MANIFEST = ".tfmp-notebooks.json"

# What ``install`` did with one notebook.
COPIED = "copied"            # was missing
REFRESHED = "refreshed"      # an unedited older copy, replaced by the current version
UP_TO_DATE = "up to date"    # already the current version
KEPT = "kept"                # changed by the user: left alone


@dataclass(frozen=True)
class Outcome:
    name: str
    action: str

    def line(self) -> str:
        note = " (changed by you; delete or rename it to get the current version)" \
            if self.action == KEPT else ""
        return f"{self.name}: {self.action}{note}"


def shipped(source: Optional[os.PathLike] = None) -> Dict[str, Path]:
    """The notebooks this package ships, by file name, in reading order."""
    folder = Path(source) if source is not None else SOURCE_DIR
    return {p.name: p for p in sorted(folder.glob("*.ipynb"))}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_manifest(target: os.PathLike) -> Dict[str, str]:
    """File name -> sha256 of what was last shipped into ``target``; {} if none or unreadable."""
    try:
        with open(Path(target) / MANIFEST, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return {}
    entries = doc.get("notebooks") if isinstance(doc, dict) else None
    if not isinstance(entries, dict):
        return {}
    return {str(k): str(v) for k, v in entries.items()}


def install(target: os.PathLike, source: Optional[os.PathLike] = None) -> List[Outcome]:
    """Seed ``target`` with the shipped notebooks without overwriting user changes."""
    target = Path(target)
    folders.make_folder(str(target), "notebook folder")
    manifest = read_manifest(target)
    outcomes: List[Outcome] = []
    for name, src in shipped(source).items():
        data = src.read_bytes()
        new_hash = sha256(data)
        dest = target / name
        if not dest.exists():
            write_atomic(dest, data)
            manifest[name] = new_hash
            outcomes.append(Outcome(name, COPIED))
            continue
        try:
            current = sha256(dest.read_bytes()) if dest.is_file() else None
        except OSError:   # unreadable: the user's, as a folder or a link in its place is
            current = None
        if current is None:
            outcomes.append(Outcome(name, KEPT))
        elif current == new_hash:
            manifest[name] = new_hash
            outcomes.append(Outcome(name, UP_TO_DATE))
        elif manifest.get(name) == current:
            # Exactly what we shipped last time: the user has not touched it.
            write_atomic(dest, data)
            manifest[name] = new_hash
            outcomes.append(Outcome(name, REFRESHED))
        else:
            outcomes.append(Outcome(name, KEPT))
    doc = {"about": "notebooks shipped by `tfmp notebooks --install`; a notebook whose "
                    "sha256 differs from the one recorded here was changed and is never "
                    "overwritten",
           "notebooks": dict(sorted(manifest.items()))}
    write_atomic(target / MANIFEST, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))
    return outcomes
