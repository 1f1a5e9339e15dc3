"""Lint and consistency checks of the image's files (no container needed, but
they belong to the image suite and run wherever it runs)."""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from image_helpers import REPO, run

pytestmark = pytest.mark.docker

SHELL_SCRIPTS = sorted(
    {REPO / "entrypoint.sh", REPO / ".ci/run", REPO / "docker/config/profile-container-env.sh"}
    | set((REPO / "docker").rglob("*.sh"))
    | set((REPO / "tests/image").glob("*.sh"))
    | set((REPO / "tests/benchmarks").glob("*.sh"))
)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (.ci/run installs it)")
    return path


def test_hadolint_dockerfile():
    proc = run([_tool("hadolint"), "--failure-threshold", "info", "Dockerfile"], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck(script):
    proc = run([_tool("shellcheck"), "--external-sources", str(script)], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _requirement_names(lines) -> set[str]:
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def test_image_requirements_cover_the_package_dependencies():
    """The image installs `app` without resolving its dependencies (fast rebuilds),
    so docker/build/requirements.txt must list every runtime dependency of pyproject.toml."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the test extra installs tomli (the same parser) on older Pythons
        import tomli as tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    image_reqs = _requirement_names((REPO / "docker/build/requirements.txt").read_text().splitlines())
    missing = _requirement_names(deps) - image_reqs
    assert not missing, f"add to docker/build/requirements.txt: {sorted(missing)}"


def test_constraints_pin_what_tf_2_9_needs():
    text = (REPO / "docker/build/constraints.txt").read_text()
    assert re.search(r"^numpy[^\n]*<2\b", text, re.M)
    assert re.search(r"^protobuf[^\n]*<3\.20\b", text, re.M)
    assert re.search(r"^tensorflow==2\.9\.3$", text, re.M)


@pytest.mark.parametrize("files", [["docker-compose.yml"],
                                   ["docker-compose.yml", "docker-compose.cpu.yml"]])
def test_compose_files_are_valid(files):
    args = ["docker", "compose"]
    for f in files:
        args += ["-f", f]
    proc = run(args + ["--profile", "batch", "config", "--format", "json"], timeout=60)
    import json

    cfg = json.loads(proc.stdout)
    jupyter = cfg["services"]["tfmp"]
    has_gpu = "deploy" in jupyter
    assert has_gpu == (len(files) == 1)
    assert {p["target"] for p in jupyter["ports"]} == {8888, 22}
    assert all(p["host_ip"] == "127.0.0.1" for p in jupyter["ports"])
    assert jupyter["shm_size"] and jupyter["ulimits"]["stack"] == 67108864
    assert jupyter["environment"]["JUPYTER_UI"] == os.environ.get("JUPYTER_UI", "lab")
    assert cfg["services"]["train"]["command"] == ["tfmp", "train"]
    # The home is one named volume, shared by the service and batch jobs (docs/image.md,
    # "What persists"); Docker seeds an empty named volume from the image, never a bind mount.
    for service in ("tfmp", "train"):
        mounts = {v["target"]: v for v in cfg["services"][service]["volumes"]}
        assert mounts["/home/tf"]["type"] == "volume" and mounts["/home/tf"]["source"] == "home"
        assert mounts["/workspace"]["source"] == "workspace"
    assert "home" in cfg["volumes"]


# The rule of docs/image.md, "Security: root at start and the user's files", as far as it can be
# read from the text: every command line of the start-up that names a path under the home runs
# as the user (HELPER_CMD, USER_CMD, setpriv), or is one of root's few operations on the home's
# top folder.
HOME_EXPR = re.compile(r"\$\{?(USER_HOME|HOME_TOKEN_FILE|HOME_TOKEN_DIR|home|home_keys)\b")
ROOT_ON_THE_TOP = [
    re.compile(r'stat -c %u:%g "\$USER_HOME"'),                         # the top's owner
    re.compile(r'find "\$USER_HOME" -mindepth 1 -maxdepth 1 -print -quit'),  # is it empty
    re.compile(r'^chown "\$NB_UID:\$NB_GID" "\$USER_HOME"$'),             # an empty home's top
    # the re-owning walk: no link followed, mounts below the home pruned, ./NAME for chown
    re.compile(r'^env PATH="\$path" find "\$USER_HOME" -xdev \\\( -false "\$\{mounts\[@\]\}" \\\) '
               r'-prune -o -[ug]id "\$old_[ug]id"\s+-execdir chown -h --from="?:?\$old_[ug]id"? '),
    re.compile(r'^mapfile -t mounts < <\(mounts_below "\$USER_HOME"\)$'),   # the mount table's text
    re.compile(r'^usermod -d "\$USER_HOME" "\$NB_USER"$'),               # the passwd field only
    re.compile(r'^printf \'%s\\0\' HOME="\$USER_HOME" USER='),  # text: the user's environment
    re.compile(r'^validate_keys "\$user_keys" "\$home_keys"$'),     # root's copy; a name in messages
    re.compile(r'^for dir in "\$USER_HOME" "\$WORKSPACE"$'),        # refuse_user_path: text only
    re.compile(r'^\$2 == "\$USER_HOME"'),                            # CHOWN_EXTRA's check: text only
    re.compile(r'^\$USER_HOME == "\$2"/\*'),                          # ...and above the home
    # A --user start (never root): the passwd entry's text, and HOME.
    re.compile(r'^printf \'%s:x:%s:%s:%s:%s:/bin/bash\\n\' "\$NB_USER"'),
    re.compile(r'^export HOME=\$USER_HOME$'),
]
TEXT_ONLY = re.compile(r"^(?:(?:local|readonly)\s+)?[A-Za-z_][A-Za-z0-9_]*=|^(?:info|warn|fatal|announce|log)\b|^#")
KEYWORD = re.compile(r"^(?:then|do|else|if|elif|while|until|!|\{)\s+")


def _commands(text: str):
    """The script's simple commands: continuation lines joined, split at unquoted ;, &&, ||
    and |, leading keywords (if, then, !) removed.  Quoted text (a `sh -c` script) stays whole."""
    text = re.sub(r"\\\n\s*", " ", text)
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):
            continue
        parts, cur, quote, i = [], "", "", 0
        while i < len(line):
            c = line[i]
            if quote:
                cur += c
                if c == quote:
                    quote = ""
                elif c == "\\" and quote == '"' and i + 1 < len(line):
                    cur += line[i + 1]
                    i += 1
            elif c in "'\"":
                quote, cur = c, cur + c
            elif line.startswith(("&&", "||"), i) or c in ";|":
                parts.append(cur)
                cur = ""
                i += 1 if line.startswith(("&&", "||"), i) else 0
            elif c == "#" and (not cur or cur[-1].isspace()):
                break
            else:
                cur += c
            i += 1
        parts.append(cur)
        for part in parts:
            part = part.strip()
            while KEYWORD.match(part):
                part = KEYWORD.sub("", part, count=1)
            if part:
                yield part


def test_root_at_start_names_home_paths_only_as_the_user():
    parts = [REPO / "entrypoint.sh", *sorted((REPO / "docker/start").rglob("*.sh"))]
    offending = []
    for path in parts:
        for line in _commands(path.read_text()):
            if not HOME_EXPR.search(line) or TEXT_ONLY.match(line) or line.startswith("[["):
                continue
            if any(f"${{{prefix}[@]}}" in line for prefix in ("USER_CMD", "HELPER_CMD")) \
                    or line.startswith("setpriv ") or " setpriv " in line:
                continue
            if any(p.search(line) for p in ROOT_ON_THE_TOP):
                continue
            offending.append(f"{path.relative_to(REPO)}: {line}")
    assert not offending, "root acts on a path under the home:\n" + "\n".join(offending)


def test_the_start_runs_its_own_steps_as_the_user_through_helper_cmd_only():
    """USER_CMD (the user site on, JUPYTER_ENV_VARS_TO_UNSET's variables as they are at that
    moment) is for what the start hands over to, exec'd last: the services, the command, the
    self-test.  What the root start itself runs as the user goes through HELPER_CMD, without
    the user site (a .pth file there is the user's code) and the secrets (entrypoint.sh,
    user_cmd)."""
    parts = [REPO / "entrypoint.sh", *sorted((REPO / "docker/start").rglob("*.sh"))]
    offending = [f"{path.relative_to(REPO)}: {line}" for path in parts
                 for line in _commands(path.read_text())
                 if "${USER_CMD[@]}" in line and not line.startswith("exec ")]
    assert not offending, "run as the user with USER_CMD, not HELPER_CMD:\n" + "\n".join(offending)


# --- each start-up part's variables, listed once (its "Environment:" block) ------------------

ENV_BLOCK = re.compile(r"^#\s*Environment( read here)?:\s*$")
ENV_LINE = re.compile(r"^#   ([A-Z][A-Z0-9_]+(?:, [A-Z][A-Z0-9_]+)*)\b")
DOCS_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]+)`(?:, `([A-Z][A-Z0-9_]+)`)? \|", re.M)


def _part_variables(path: Path) -> list:
    """The variables a part's header "Environment:" block names (the one place they are
    listed; the core's own block is "Environment read here:")."""
    names, inside = [], False
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            if inside:
                break
            continue
        if ENV_BLOCK.match(line):
            inside = True
        elif inside and ENV_LINE.match(line):
            names += ENV_LINE.match(line).group(1).split(", ")
        elif inside and line.strip() == "#":
            break
    return names


def test_the_docs_variable_table_is_the_parts_environment_blocks():
    parts = [REPO / "entrypoint.sh", *sorted((REPO / "docker/start").rglob("*.sh"))]
    in_parts = [n for p in parts for n in _part_variables(p)]
    assert len(in_parts) == len(set(in_parts)), "a variable is listed by two parts"
    table = {n for row in DOCS_ROW.findall((REPO / "docs/image.md").read_text()) for n in row if n}
    assert set(in_parts) == table


# Set by others, not by a .env: a JupyterHub spawner (the hub's token), and the container's
# port, which the compose file publishes as 8888 (JUPYTER_HOST_PORT moves the host's side).
NOT_FROM_COMPOSE = {"JUPYTERHUB_API_TOKEN", "JUPYTER_PORT"}


def test_compose_passes_every_documented_setting_and_every_train_variable():
    """A setting in .env reaches the container only when the compose file names it: every
    variable of docs/image.md's table reaches the interactive service, and every `TFMP_`
    variable train reads (app.core.settings) reaches both services."""
    yaml = pytest.importorskip("yaml")
    sys.path.insert(0, str(REPO))
    from app.core import settings

    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    table = {n for row in DOCS_ROW.findall((REPO / "docs/image.md").read_text()) for n in row if n}
    train_vars = {s.env for s in settings.BY_NAME.values() if s.env}
    assert not (table - NOT_FROM_COMPOSE) - set(services["tfmp"]["environment"])
    for name in ("tfmp", "train"):
        assert not train_vars - set(services[name]["environment"]), name
    # A bare key (no value) that neither .env nor the shell sets is sent as a name alone,
    # which unsets the variable in the container: the image's own ENV ones need a default.
    image_env = set(re.findall(r"^(?:ENV |    )([A-Z][A-Z0-9_]*)=", (REPO / "Dockerfile").read_text(),
                               re.M))
    for name in ("tfmp", "train"):
        bare = {k for k, v in services[name]["environment"].items() if v is None}
        assert not bare & image_env, (name, bare & image_env)


def test_serve_parts_carry_no_mode_guard():
    """The phase is the folder (docker/start/always, docker/start/serve), not a guard."""
    for path in (REPO / "docker/start").rglob("*.sh"):
        assert "$MODE == serve ]] || return" not in path.read_text(), path


def test_the_entrypoint_knows_every_tfmp_command():
    """`docker run IMAGE train ...` runs `tfmp train ...`: the entrypoint's list of the
    commands it passes to tfmp is the package's own."""
    from app.commands import COMMANDS

    listed = re.search(r"^readonly TFMP_COMMANDS=\(([^)]*)\)", (REPO / "entrypoint.sh").read_text(),
                       re.M)
    assert listed, "entrypoint.sh has no TFMP_COMMANDS"
    assert sorted(listed.group(1).split()) == sorted(COMMANDS)
