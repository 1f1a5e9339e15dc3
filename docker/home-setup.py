#!/usr/bin/env python3
"""The persistent home's two start-up jobs (installed as /usr/local/bin/tfmp-home).

    tfmp-home sync --image-home DIR [--home DIR]
        Bring the image's own files in the home (DIR, a pristine copy kept in the image) into
        the user's home: a missing file is added, a copy the user never changed is refreshed
        to the image's current version, a file the user edited is kept; a missing folder is
        created private (700).  Prints one summary line.  Run as the user, so everything it
        writes is the user's.
    tfmp-home check [--constraints FILE] [--user-site DIR]
        One line per distribution in the user site (`pip install --user`) that would break
        the image's Python: a version outside the image's constraints (numpy 2 with
        --no-deps or PIP_CONSTRAINT unset), or a `pip check` conflict it causes (its own
        requirements unmet, or another package's requirement on it broken).  Prints nothing
        when all is well.

Why a record of what was installed (<home>/.local/state/tfmp/image-files.json): the home
outlives the image, so "the user's file" and "an older image's file" look alike on disk.  A
file whose content is still exactly what an earlier image put there is the image's to
refresh; any other content is the user's.

Why `check` reads the constraints file and does not just run `pip check`: TensorFlow 2.9.3
declares numpy>=1.20 with no upper bound, so `pip check` is happy with a numpy 2 that makes
`import tensorflow` fail.  The image's constraints (/etc/tfmp/constraints.txt, exported as
PIP_CONSTRAINT) hold what TF 2.9 really needs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import site
import stat
import sys
import tempfile
from importlib import metadata

RECORD = os.path.join(".local", "state", "tfmp", "image-files.json")
DEFAULT_CONSTRAINTS = "/etc/tfmp/constraints.txt"


class UsageError(Exception):
    """One line for the user: what was wrong and what is allowed."""


# --- sync: the image's files in the home --------------------------------------------

def _digest(path: str) -> str:
    if os.path.islink(path):
        return "link:" + os.readlink(path)
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 16), b""):
            sha.update(block)
    return "sha256:" + sha.hexdigest()


def _load_record(home: str) -> dict:
    try:
        with open(os.path.join(home, RECORD), encoding="utf-8") as fh:
            record = json.load(fh)
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}  # no record yet (a home from before it existed): every differing file is kept


def _write_atomic(path: str, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tfmp-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _install(src: str, dest: str) -> None:
    if os.path.islink(src):
        tmp = dest + ".tfmp-link"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(os.readlink(src), tmp)
        os.replace(tmp, dest)
    else:
        with open(src, "rb") as fh:
            _write_atomic(dest, fh.read(), stat.S_IMODE(os.stat(src).st_mode))


def sync_home(image_home: str, home: str) -> dict:
    """Returns {"added": [...], "refreshed": [...], "kept": [...]} (paths relative to home)."""
    record = _load_record(home)
    done: dict = {"added": [], "refreshed": [], "kept": []}
    for root, dirs, files in os.walk(image_home):
        dirs.sort()
        rel_root = os.path.relpath(root, image_home)
        for name in list(dirs):
            src = os.path.join(root, name)
            dest = os.path.normpath(os.path.join(home, rel_root, name))
            if os.path.islink(src):
                continue
            if not os.path.lexists(dest):
                # Private, whatever the copy's mode: the copy is readable by every NB_UID,
                # and ~/.ssh or ~/.jupyter must not be.
                os.mkdir(dest, 0o700)
            elif not os.path.isdir(dest):
                # The user put something else there: it and the image's folder stay apart.
                dirs.remove(name)
                done["kept"].append(os.path.normpath(os.path.join(rel_root, name)))
        # Symlinks to folders come in `dirs`: a link is installed like a file.
        for name in sorted(files) + sorted(d for d in dirs if os.path.islink(os.path.join(root, d))):
            src = os.path.join(root, name)
            rel = os.path.normpath(os.path.join(rel_root, name))
            dest = os.path.join(home, rel)
            new = _digest(src)
            if not os.path.lexists(dest):
                _install(src, dest)
                done["added"].append(rel)
            elif os.path.isdir(dest) and not os.path.islink(dest):
                done["kept"].append(rel)
                continue
            else:
                current = _digest(dest)
                if current != new:
                    if record.get(rel) != current:
                        done["kept"].append(rel)  # the user's own content: never touched
                        continue
                    _install(src, dest)
                    done["refreshed"].append(rel)
            record[rel] = new
    path = os.path.join(home, RECORD)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_atomic(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode(), 0o644)
    return done


def sync_summary(done: dict) -> str:
    parts = [f"{len(done[k])} {k}" for k in ("added", "refreshed", "kept")]
    line = "image files in the home: " + ", ".join(parts)
    if done["kept"]:
        line += f" (yours, left as they are: {' '.join(done['kept'])})"
    return line


# --- check: user-site packages that would break the image ----------------------------

def _normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def read_constraints(path: str) -> dict:
    """{normalized name: [Requirement, ...]} for the constraint lines that apply here."""
    from packaging.requirements import InvalidRequirement, Requirement

    found: dict = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue  # pip would have refused the file already; not our line to print
            if req.marker is None or req.marker.evaluate():
                found.setdefault(_normalize(req.name), []).append(req)
    return found


def _installed(paths: list) -> dict:
    """{normalized name: Distribution}, the first one on `paths` (the one Python imports)."""
    found: dict = {}
    for dist in metadata.distributions(path=paths):
        name = dist.metadata["Name"]
        if name and _normalize(name) not in found:
            found[_normalize(name)] = dist
    return found


def _runtime_requirements(dist) -> list:
    from packaging.requirements import InvalidRequirement, Requirement

    reqs = []
    for text in dist.requires or []:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        # As `pip check`: requirements of extras nobody asked for do not count.
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            reqs.append(req)
    return reqs


def _satisfies(version: str, req) -> bool:
    from packaging.version import InvalidVersion

    try:
        return req.specifier.contains(version, prereleases=True)
    except InvalidVersion:
        return True  # a version packaging cannot read: no claim either way, no warning


def find_problems(user_site: str, other_paths: list, constraints: dict) -> list:
    """One line per user-site distribution that breaks the constraints or a requirement."""
    if not os.path.isdir(user_site):
        return []
    installed = _installed([user_site] + [p for p in other_paths if p != user_site])
    requirements = {key: _runtime_requirements(dist) for key, dist in installed.items()}
    lines = []
    # The user site comes first on sys.path: its copy of a name is the one Python imports.
    for key, dist in sorted(_installed([user_site]).items()):
        name, version = dist.metadata["Name"], dist.version
        why = []
        for req in constraints.get(key, []):
            if not _satisfies(version, req):
                why.append(f"outside the image's constraints ({req.name}{req.specifier}), "
                           "which keep TensorFlow working")
        for req in requirements[key]:
            other = installed.get(_normalize(req.name))
            if other is None:
                why.append(f"needs {req}, which is not installed")
            elif not _satisfies(other.version, req):
                why.append(f"needs {req.name}{req.specifier}, but {req.name} {other.version} "
                           "is installed")
        for other_key, other in sorted(installed.items()):
            if other_key == key:
                continue
            for req in requirements[other_key]:
                if _normalize(req.name) == key and not _satisfies(version, req):
                    why.append(f"breaks {other.metadata['Name']} {other.version} "
                               f"(needs {req.name}{req.specifier})")
        if why:
            lines.append(f"user package {name} {version} in {user_site}: {'; '.join(why)}; "
                         f"`pip uninstall {name}` removes it")
    return lines


def default_user_site() -> str:
    return site.getusersitepackages() if site.ENABLE_USER_SITE else ""


# --- command line ---------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfmp-home", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    sync = sub.add_parser("sync", help="add or refresh the image's files in the home")
    sync.add_argument("--image-home", required=True, help="the image's pristine copy of the home")
    sync.add_argument("--home", default=os.path.expanduser("~"), help="the home (default: ~)")
    check = sub.add_parser("check", help="user-site packages that would break the image")
    check.add_argument("--constraints", default=os.environ.get("TFMP_CONSTRAINTS",
                                                               DEFAULT_CONSTRAINTS))
    check.add_argument("--user-site", default=None,
                       help="default: this Python's user site (none when it is disabled)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "sync":
            for folder, what in ((args.image_home, "--image-home"), (args.home, "--home")):
                if not os.path.isdir(folder):
                    raise UsageError(f"{what} {folder!r} is not a folder; allowed: an existing folder")
            print(sync_summary(sync_home(args.image_home, args.home)))
        elif args.command == "check":
            if not os.path.isfile(args.constraints):
                raise UsageError(f"--constraints {args.constraints!r} is not a file; "
                                 "allowed: a pip constraints file")
            user_site = default_user_site() if args.user_site is None else args.user_site
            if user_site:
                for line in find_problems(user_site, sys.path, read_constraints(args.constraints)):
                    print(line)
        else:
            raise UsageError("a command is needed; allowed: sync, check")
    except UsageError as err:
        print(f"tfmp-home: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
