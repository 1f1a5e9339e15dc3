"""The persistent home (issue 18, part 1; docs/image.md "What persists"), as a user lives
it: things installed and configured over SSH and through JupyterLab, then `docker compose
down` (volumes kept) and `up` on a rebuilt image with another NB_UID, then a user-site
numpy 2 that would break TensorFlow.  One test with its own stack, because it takes the
stack down and up (each start costs seconds on these machines)."""
from __future__ import annotations

import http.client
import io
import json
import os
import re
import shlex
import socket
import tarfile
import textwrap
import uuid
from pathlib import Path

import pytest
import requests

from image_helpers import (HOST_GID, HOST_UID, REPO, docker_run, exec_in, health, kernel_execute,
                           run, wait_until)
from test_stack import ssh_client, ssh_run

pytestmark = pytest.mark.docker

THEME_SETTING = "/lab/api/settings/@jupyterlab/apputils-extension:themes"
PROBE = "tfmp_home_probe"
FIND_LINKS = "--no-index --find-links /workspace/wheels"


def build_wheel(folder: Path, project: str, version: str, module: str, body: str,
                out: Path) -> None:
    """A tiny pure-Python wheel, built on the host with `pip wheel` (no index needed)."""
    src = folder / f"{project}-src"
    src.mkdir()
    (src / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{project}"
        version = "{version}"

        [tool.setuptools]
        py-modules = ["{module}"]
        """))
    (src / f"{module}.py").write_text(body)
    run(["python3", "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(out), str(src)], timeout=180, cwd=folder)


def ssh_ok(client, command: str, timeout: float = 180) -> str:
    status, out, err = ssh_run(client, command, timeout=timeout)
    assert status == 0, f"{command} -> {status}\n{out[-2000:]}\n{err[-3000:]}"
    return out


def theme(stack) -> requests.Response:
    return requests.get(stack.base_url + THEME_SETTING, timeout=30,
                        headers={"Authorization": f"token {stack.token()}"})


def start(stack) -> None:
    stack.compose("up", "-d", "--no-build", "tfmp", timeout=180)
    stack.wait_healthy()


def logs(stack, since: str = "") -> list:
    """The service's log lines (the entrypoint writes to stderr), from ``since`` if given."""
    proc = stack.compose("logs", "--no-color", *(["--since", since] if since else []), "tfmp",
                         timeout=60)
    return (proc.stdout + proc.stderr).splitlines()


def test_home_survives_down_and_up_on_a_rebuilt_image_with_a_new_uid(own_stack, image,
                                                                      tmp_path):
    st = own_stack
    wheels = st.workspace / "wheels"
    build_wheel(tmp_path, "tfmp-home-probe", "0.1", PROBE, "VALUE = 'probe-ok'\n", wheels)
    # Stands for numpy 2 on the index: what `pip install 'numpy>=2'` would find.
    build_wheel(tmp_path, "numpy", "2.0.0", "tfmp_fake_numpy", "", wheels)

    # --- first start: the user installs and configures --------------------------------
    start(st)
    with ssh_client(st) as client:
        ssh_ok(client, f"pip install --user {FIND_LINKS} tfmp-home-probe")
        ssh_ok(client, "mkdir -p ~/.vscode-server/bin/c0ffee"
                       " && echo server-v1 > ~/.vscode-server/bin/c0ffee/marker"
                       " && printf 'Host gpu-box\\n  User me\\n' > ~/.ssh/config"
                       " && echo '[gpu-box]:22 ssh-ed25519 AAAAC3Nz' > ~/.ssh/known_hosts"
                       " && echo '# my own line' >> ~/.profile && rm ~/.bash_logout")
        shell = client.invoke_shell()
        shell.settimeout(30)
        shell.send("echo tfmp-history-marker\n")
        seen = bytearray()

        def prompt_after_output():
            seen.extend(shell.recv(65536))
            # The typed line is echoed, then printed; then the next prompt (history -a).
            return seen.count(b"tfmp-history-marker") >= 2 and \
                b"$ " in seen[seen.rindex(b"tfmp-history-marker"):]

        wait_until(prompt_after_output, 30, what="the interactive shell to run the command")
        shell.close()  # the terminal goes away without `exit`
    resp = requests.put(st.base_url + THEME_SETTING, timeout=30,
                        headers={"Authorization": f"token {st.token()}"},
                        data=json.dumps({"raw": '{"theme": "JupyterLab Dark"}'}))
    assert resp.status_code == 204, resp.text
    assert not [line for line in logs(st) if " WARN " in line and "user package" in line]
    # The compose file mounts the volume 'workspace': nothing to warn of.
    assert not [line for line in logs(st) if "is not a mounted folder" in line]

    # --- down (volumes kept), then up on a rebuilt image, as another user ------------------
    st.compose("down", "-t", "5", timeout=120)
    rebuilt = f"{image}-home-rebuilt"
    run(["docker", "build", "-t", rebuilt, "-"], timeout=300, input=(
        f"FROM {image}\nLABEL tfmp.test.rebuilt=yes\n"
        # The new image changes two of its home files: one the user never edited (refreshed)
        # and one the user edited (kept as the user left it).
        "RUN echo '# from the rebuilt image' >> /usr/local/share/tfmp/home/.bashrc"
        " && echo '# from the rebuilt image' >> /usr/local/share/tfmp/home/.profile\n"))
    new_uid, new_gid = HOST_UID + 1, HOST_GID + 1
    st.env.update(IMAGE=rebuilt, NB_UID=str(new_uid), NB_GID=str(new_gid))
    try:
        start(st)
        label = run(["docker", "inspect", "-f", '{{index .Config.Labels "tfmp.test.rebuilt"}}',
                     st.container]).stdout.strip()
        assert label == "yes"
        first_logs = logs(st)
        assert sum(f"re-owned /home/tf for UID {new_uid}, GID {new_gid}" in line
                   for line in first_logs) == 1, first_logs[-40:]
        assert any(line.endswith("image files in the home: 1 added, 1 refreshed, 1 kept "
                                 "(yours, left as they are: .profile)") for line in first_logs), \
            first_logs[-40:]
        not_owned = exec_in(st.container, "find", "/home/tf", "(", "!", "-uid", str(new_uid),
                            "-o", "!", "-gid", str(new_gid), ")", "-print").stdout
        assert not_owned == "", not_owned

        with ssh_client(st) as client:
            assert ssh_ok(client, "id -u").strip() == str(new_uid)
            out = ssh_ok(client, f"python3 -c 'import {PROBE}; print({PROBE}.VALUE, "
                                 f"{PROBE}.__file__)'")
            assert re.match(rf"probe-ok /home/tf/\.local/lib/python3\.\d+/site-packages/{PROBE}",
                            out), out
            assert ssh_ok(client, "cat ~/.vscode-server/bin/c0ffee/marker") == "server-v1\n"
            assert "Host gpu-box" in ssh_ok(client, "cat ~/.ssh/config")
            assert "[gpu-box]:22" in ssh_ok(client, "cat ~/.ssh/known_hosts")
            assert "tfmp-history-marker" in ssh_ok(client, "cat ~/.bash_history")
            # The image's files: the unedited one refreshed, the edited one kept, the
            # deleted one back.
            assert ssh_ok(client, "tail -n 1 ~/.bashrc") == "# from the rebuilt image\n"
            profile = ssh_ok(client, "cat ~/.profile")
            assert "# my own line" in profile and "rebuilt image" not in profile
            ssh_ok(client, "test -s ~/.bash_logout")
            # Still under the image's constraints: numpy 2 is refused, and only by them.
            status, out, err = ssh_run(client, f"pip install --user {FIND_LINKS} 'numpy>=2'")
            assert status != 0 and "numpy" in out + err and "conflict" in (out + err).lower(), \
                out[-2000:] + err[-2000:]
            out = ssh_ok(client, f"PIP_CONSTRAINT= pip install --user --dry-run {FIND_LINKS} "
                                 "'numpy>=2'")
            assert "Would install numpy-2.0.0" in out, out
            user_site = ssh_ok(client, "python3 -c 'import site; "
                                       "print(site.getusersitepackages())'").strip()
        assert "JupyterLab Dark" in theme(st).json()["raw"]
        text, errors = kernel_execute(st.base_url, st.token(),
                                      f"import {PROBE}; print({PROBE}.VALUE)")
        assert not errors and text.strip() == "probe-ok", (text, errors)
        # A batch job of the compose file mounts the same home: the same user package.
        job = st.compose("--profile", "batch", "run", "--rm", "-T", "train", "python3", "-c",
                         f"import {PROBE}, os; print({PROBE}.VALUE, os.getuid())", timeout=240)
        assert job.stdout.splitlines()[-1] == f"probe-ok {new_uid}", job.stdout[-2000:]

        # --- a user-site numpy 2 (as `--no-deps` would leave it): one WARN at the next start
        stub = f"{user_site}/numpy-2.0.0.dist-info"
        with ssh_client(st) as client:
            ssh_ok(client, f"mkdir -p {shlex.quote(stub)} && printf 'Metadata-Version: 2.1\\n"
                           f"Name: numpy\\nVersion: 2.0.0\\n' > {shlex.quote(stub)}/METADATA")
        since = run(["date", "-u", "+%Y-%m-%dT%H:%M:%S.%NZ"]).stdout.strip()
        st.compose("restart", "-t", "5", "tfmp", timeout=120)
        wait_until(lambda: "Jupyter URL" in "".join(logs(st, since)), 90,
                   what="the restart's start-up lines")
        st.wait_healthy()
        restart_logs = logs(st, since)
        warns = [line for line in restart_logs
                 if " WARN " in line and ("user package" in line or "numpy" in line)]
        assert len(warns) == 1 and "user package numpy 2.0.0" in warns[0] \
            and user_site in warns[0], restart_logs
        # Same UID on a restart: the home is not walked again.
        assert not [line for line in restart_logs if "re-owned" in line], restart_logs
    finally:
        st.compose("down", "-v", "-t", "5", check=False, timeout=120)
        run(["docker", "image", "rm", rebuilt], check=False, timeout=60)


# --- root at start and a home the user controls (issue 24, items 1 and 2) -------------------

START_PARTS = [REPO / "entrypoint.sh", *sorted((REPO / "docker/start").rglob("*.sh")),
               REPO / "docker/bin/tfmp-home"]
HOME = "/home/tf"
# Shell assignments (`NAME=value`, `readonly NAME=value`, `local name=value`) the home paths
# are built from, e.g. TOKEN_FILE=$USER_HOME/.jupyter/token, HOME_MARKER=.local/state/...
ASSIGNMENT = re.compile(r"^\s*(?:readonly\s+|local\s+)?([A-Za-z_][A-Za-z0-9_]*)=([^\s;()]+)\s*$",
                        re.M)
SHELL_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
HOME_PATH = re.compile(r"(?:\$\{?(?:USER_HOME|HOME|home)\}?|/home/tf|~)/([A-Za-z0-9._*/$-]+)")
# home-setup.py's paths relative to the home: os.path.join(".local", "state", ...).
PY_JOIN = re.compile(r"os\.path\.join\(((?:\s*\"\.[^\"]*\"\s*,?)(?:\s*\"[^\"]*\"\s*,?)*)\)")
# Where the links point: root's folders and files, the SSH host key (a secret) among them.
DIR_TARGETS = ["/etc", "/root", "/usr/local/bin", "/etc/ssh"]
FILE_TARGETS = ["/etc/shadow", "/etc/ssh/host_keys/ssh_host_ed25519_key", "/etc/gshadow",
                "/usr/local/bin/tfmp-healthcheck"]
# Files a start rewrites by design; their owner and mode must still be what they were.
REWRITTEN_AT_START = {
    # usermod/groupmod/chpasswd at every start (the password field is set again each time)
    "/etc/passwd", "/etc/passwd-", "/etc/shadow", "/etc/shadow-", "/etc/group", "/etc/group-",
    "/etc/gshadow", "/etc/gshadow-",
    # 00-environment.sh: the container's environment for SSH sessions, written at every start
    "/etc/tfmp/container.env", "/etc/tfmp/ssh-extra-env.sh", "/etc/tfmp/unset-private.sh",
    "/etc/ssh/sshd_config.d/tfmp-environment.conf",
    # 20-ssh.sh: the authorized keys root assembles at every start
    "/etc/ssh/authorized_keys/tf",
    # Docker itself, at every start (the container's address may change)
    "/etc/hostname", "/etc/hosts", "/etc/resolv.conf",
}
# Only when two containers are compared: what the first start makes per container.
PER_CONTAINER = {"/etc/ssh/host_keys/ssh_host_ed25519_key",
                 "/etc/ssh/host_keys/ssh_host_ed25519_key.pub",
                 "/etc/ssh/host_keys/ssh_host_rsa_key", "/etc/ssh/host_keys/ssh_host_rsa_key.pub"}

# Owner, mode, type and content of every path under /etc, /usr/local and /root.  Content is
# a file's sha256, but /usr/local holds TensorFlow (1.6 GB, seconds to hash), so a file whose
# inode change time and inode number are those of the snapshot given on stdin keeps that
# snapshot's hash: every write, chown, chmod or link count change sets ctime (cp -p and
# touch can set mtime back, nothing but the clock sets ctime), so such a file is unchanged.
SNAPSHOT = r"""
import hashlib, json, os, stat, sys
base = json.load(sys.stdin)
out, witness = {}, {}
def add(path):
    st = os.lstat(path)
    entry = [st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), stat.S_IFMT(st.st_mode)]
    witness[path] = [st.st_ctime_ns, st.st_ino]
    if stat.S_ISREG(st.st_mode):
        if base.get("witness", {}).get(path) == witness[path]:
            entry.append(base["entries"][path][4])
        else:
            sha = hashlib.sha256()
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    sha.update(block)
            entry.append(sha.hexdigest())
    elif stat.S_ISLNK(st.st_mode):
        entry.append(os.readlink(path))
    out[path] = entry
for top in ("/etc", "/usr/local", "/root"):
    add(top)
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            add(os.path.join(root, name))
json.dump({"entries": out, "witness": witness}, sys.stdout)
"""


def home_paths_root_touches() -> list:
    """Every path under the home that the start-up parts name, read from the parts themselves
    (with the shell variables they are built from expanded), every folder on the way to them,
    and every file of the image's pristine home (tfmp-home sync walks it)."""
    texts = {p: p.read_text() for p in START_PARTS}
    values = {}
    for path, text in texts.items():
        if path.suffix == ".sh" or path.name == "entrypoint.sh":
            for name, value in ASSIGNMENT.findall(text):
                values.setdefault(name, value.strip("\"'"))
    found = set()
    for path, text in texts.items():
        for _ in range(4):  # TOKEN_FILE=$STATE_DIR/..., HOME_TOKEN_FILE=$USER_HOME/...
            text = SHELL_VAR.sub(lambda m: values.get(m.group(1), m.group(0))
                                 if m.group(1) not in ("USER_HOME", "HOME", "home") else m.group(0),
                                 text)
        for rel in HOME_PATH.findall(text):
            found.add(rel)
        for args in PY_JOIN.findall(text):
            found.add("/".join(re.findall(r"\"([^\"]*)\"", args)))
    rels = set()
    for rel in found:
        parts = []
        for part in rel.strip("/").split("/"):
            if not part or any(c in part for c in "*?[$") or part in (".", ".."):
                break  # a glob or an unknown variable: the folder before it is the path
            parts.append(part)
        for depth in range(1, len(parts) + 1):
            rels.add("/".join(parts[:depth]))
    return sorted(rels)


def snapshot(name: str, base: dict | None = None) -> dict:
    """``SNAPSHOT`` in the container; ``base``: an earlier snapshot, whose hashes stand for
    the files its ctime and inode say are unchanged.  ``changes`` reads its "entries"."""
    proc = run(["docker", "exec", "-i", name, "python3", "-B", "-c", SNAPSHOT],
               input=json.dumps(base or {}), timeout=180)
    return json.loads(proc.stdout)


def changes(before: dict, after: dict, ignore_content=frozenset(), ids=None) -> list:
    """What differs; ``ids`` maps the second container's NB_UID/NB_GID to the first's."""
    ids = ids or {}
    before, after = before["entries"], after["entries"]
    found = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if new is not None:
            new = [ids.get(new[0], new[0]), ids.get(new[1], new[1]), *new[2:]]
        if old is None or new is None:
            found.append(f"{path}: {'added' if old is None else 'removed'}")
        elif path in ignore_content:
            if old[:4] != new[:4]:
                found.append(f"{path}: owner/mode {old[:4]} -> {new[:4]}")
        elif old != new:
            found.append(f"{path}: {old} -> {new}")
    return found


def started(name: str) -> str:
    """Waits for a start to end: 'healthy', or 'exited' (a refused start)."""
    def done():
        state = health(name)
        return state if state.startswith("healthy") or state.endswith("|exited") else ""
    return wait_until(done, 150, interval=0.5, what=f"{name} to start or stop")


def container_logs(name: str, since: str = "") -> str:
    proc = run(["docker", "logs", *(["--since", since] if since else []), name], check=False,
               timeout=60)
    return proc.stdout + proc.stderr


def real_folders_then(rel: str, action: str) -> str:
    """Shell: make every folder on the way to ``rel`` a real folder again (a link an earlier
    round put there removed), remove ``rel``, then ``action``."""
    steps = []
    parts = rel.split("/")
    for depth in range(1, len(parts)):
        folder = shlex.quote(f"{HOME}/{'/'.join(parts[:depth])}")
        steps.append(f"{{ [ ! -L {folder} ] || rm -f {folder}; }} && mkdir -p {folder}")
    path = shlex.quote(f"{HOME}/{rel}")
    return " && ".join(steps + [f"rm -rf {path}", action])


def plant(name: str, links: dict, hard: dict) -> list:
    """As tf: each path in ``links`` becomes a symlink to its target, each in ``hard`` a hard
    link to its target, their folders real.  A hard link tf may not make
    (fs.protected_hardlinks=1 forbids linking a file one can neither read nor write, which is
    the case for every root file worth taking) is made by root instead, as tf could on a
    host with fs.protected_hardlinks=0: what the start then does must still be safe.
    Returns the hard links root had to make."""
    script = [real_folders_then(rel, f"ln -s {shlex.quote(target)} {shlex.quote(f'{HOME}/{rel}')}")
              for rel, target in links.items()]
    script += [real_folders_then(rel, "true") for rel in hard]
    exec_in(name, "bash", "-ec", " && ".join(script) or "true", user="tf")
    by_root = []
    for rel, target in hard.items():
        path = f"{HOME}/{rel}"
        tried = exec_in(name, "ln", target, path, user="tf", check=False)
        if tried.returncode != 0:
            assert "Operation not permitted" in tried.stderr or "cross-device" in tried.stderr, \
                tried.stderr
            exec_in(name, "ln", target, path)
            by_root.append(rel)
    return by_root


def repair(name: str, rels: list, folders: set) -> None:
    """Real folders (those in ``folders``) and empty files of tf's at ``rels`` (where a round
    put links), unpacked over them on the stopped container through the engine's archive
    API: `docker cp` refuses to put a folder where a link is (its noOverwriteDirNonDir), the
    API lets the caller allow it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in sorted(set(rels)):
            info = tarfile.TarInfo(rel)
            info.type = tarfile.DIRTYPE if rel in folders else tarfile.REGTYPE
            info.mode, info.uid, info.gid = 0o700 if rel in folders else 0o600, 1000, 1000
            tar.addfile(info)
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    assert host.startswith("unix://"), f"repair() talks to a local engine only, not {host}"

    class UnixConnection(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(60)
            self.sock.connect(host[len("unix://"):])

    conn = UnixConnection("localhost")
    conn.request("PUT", f"/containers/{name}/archive?path={HOME}&noOverwriteDirNonDir=false",
                 body=buf.getvalue(), headers={"Content-Type": "application/x-tar"})
    resp = conn.getresponse()
    assert resp.status == 200, (resp.status, resp.read()[-2000:])
    conn.close()


def test_hostile_home_cannot_make_root_touch_anything_outside_it(image, container, tmp_path):
    """Issue 24, item 1: as tf, every path under the home that the start-up parts name (and
    every folder on the way) becomes a symlink to a root folder or file, round by round (one
    depth at a time, so each path's folders are real when it is replaced), then leaf files
    become hard links; after each restart nothing in /etc, /usr/local or /root changed owner,
    mode or content, except the files a start rewrites by design (REWRITTEN_AT_START, whose
    owner and mode still must not change), and the start still succeeds or stops with one
    FATAL line naming the path under the home it refused.  The home is the
    container's own folder (no volume), so hard links to root's files are possible."""
    name = container("-e", "ENABLE_SSH=1", "-e", "JUPYTER_TOKEN=hostile-home-token",
                     "--shm-size=256m")
    image_home = exec_in(name, "find", "/usr/local/share/tfmp/home", "-mindepth", "1",
                         "-printf", "%P\n").stdout
    rels = sorted(set(home_paths_root_touches()) | set(image_home.split()))
    # The parts name these (a test that found none would prove nothing).
    for needed in (".ssh", ".ssh/authorized_keys", ".jupyter", ".jupyter/token",
                   ".local/state/tfmp/home-owner", ".local/state/tfmp/image-files.json"):
        assert needed in rels, (needed, rels)
    print("paths under the home the start touches:", rels)
    assert started(name).startswith("healthy"), container_logs(name)[-3000:]
    before = snapshot(name)
    is_dir = set(exec_in(name, "bash", "-c", "cd /home/tf && for p in \"$@\"; do "
                         "[ -d \"$p\" ] && echo \"$p\"; done; true", "bash", *rels).stdout.split())

    folders = is_dir | {".ssh", ".jupyter", ".local"}

    def target(rel: str, i: int) -> str:
        return (DIR_TARGETS if rel in folders else FILE_TARGETS)[i % 4]

    rounds = []
    for depth in range(1, max(r.count("/") for r in rels) + 2):
        links = {r: target(r, i) for i, r in enumerate(r for r in rels if r.count("/") == depth - 1)}
        if links:
            rounds.append((f"symlinks at depth {depth}", links, {}))
    leaves = [r for r in rels if r not in folders and not any(o.startswith(r + "/") for o in rels)]
    rounds.append(("hard links", {}, {r: FILE_TARGETS[i % 4] for i, r in enumerate(leaves)}))
    for what, links, hard in rounds:
        by_root = plant(name, links, hard)
        if by_root:
            print(f"{what}: tf may not hard-link root's files (fs.protected_hardlinks=1); "
                  f"root made {by_root} as a host without that protection would let tf")
        since = run(["date", "-u", "+%Y-%m-%dT%H:%M:%S.%NZ"]).stdout.strip()
        run(["docker", "restart", "-t", "5", name], timeout=120)
        state = started(name)
        logs = container_logs(name, since)
        if not state.startswith("healthy"):
            # A refused start must say which path under the home, in one FATAL line.
            fatal = [line for line in logs.splitlines() if " FATAL " in line]
            assert len(fatal) == 1 and f" {HOME}/" in fatal[0], f"{what}: {state}\n{logs[-3000:]}"
            print(f"{what}: refused: {fatal[0]}")
            # Put real folders back where the round's links are (docker cp works on a stopped
            # container), then start again: whatever the refused start did outside the home
            # would still be there for the snapshot below.
            repair(name, list(links) + list(hard), folders)
            run(["docker", "start", name], timeout=120)
            assert started(name).startswith("healthy"), container_logs(name)[-3000:]
        after = snapshot(name, before)
        found = changes(before, after, REWRITTEN_AT_START)
        assert not found, f"{what} ({links or hard}): outside the home\n" + "\n".join(found[:40])
        assert "/etc/ld.so.preload" not in after["entries"]
    # The server's and the healthcheck's token is root's; the user's copy is the user's.
    assert exec_in(name, "stat", "-c", "%U:%G %a", "/run/tfmp/jupyter/token",
                   "/run/tfmp").stdout.split() == ["root:tf", "640", "root:root", "755"]


def test_re_owning_a_hostile_home_for_a_new_uid_follows_no_link(image, container):
    """Item 1 for the one walk root makes through the home: the re-owning when NB_UID changes
    (a volume the image made).  Every path the parts name is a symlink to a root file or
    folder, planted by tf before the change; the new container re-owns the home and nothing
    in /etc, /usr/local or /root changes but what differs per container."""
    volume = f"tfmp-hostile-{uuid.uuid4().hex[:8]}"
    data = f"{volume}-data"   # another file system, mounted below the home
    rels = home_paths_root_touches()
    # The marker stays: it is what makes the home the image's (without it the start refuses
    # the home, test_a_bind_mounted_home_of_another_uid_is_never_re_owned); tf could only
    # say in it what the owner check needs anyway.
    leaves = [r for r in rels if not any(o.startswith(r + "/") for o in rels)
              and not r.endswith("/home-owner")]
    links = {r: (FILE_TARGETS + DIR_TARGETS)[i % 8] for i, r in enumerate(leaves)}
    lines = [real_folders_then(r, f"ln -s {shlex.quote(t)} {shlex.quote(f'{HOME}/{r}')}")
             for r, t in links.items()]
    name = ""
    try:
        # tf (UID 1000, GID 1000) also makes files of its own, with its GID, not the group of
        # the home's top (the image's 1000:0); and a file on the data volume.
        lines += ["mkdir -p ~/project && echo x > ~/project/f.txt", "echo x > /workspace/f.txt"]
        planted = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{volume}:{HOME}",
                             "-v", f"{data}:/workspace",
                             command=["bash", "-ec", " && ".join(lines)], timeout=120)
        assert planted.returncode == 0, planted.stderr[-2000:]
        reference = container("-e", "ENABLE_SSH=0", "--shm-size=256m")
        name = container("-e", "ENABLE_SSH=0", "--shm-size=256m", "-e", "NB_UID=4500",
                         "-e", "NB_GID=4500", "-v", f"{volume}:{HOME}",
                         "-v", f"{data}:{HOME}/data")
        for box in (reference, name):
            assert started(box).startswith("healthy"), container_logs(box)[-3000:]
        logs = container_logs(name)
        assert "re-owned /home/tf for UID 4500, GID 4500 (it was the image's, of UID 1000)" in logs
        first = snapshot(reference)
        found = changes(first, snapshot(name, first), REWRITTEN_AT_START | PER_CONTAINER,
                        ids={4500: 1000})
        assert not found, "\n".join(found[:40])
        # The links themselves were re-owned (lchown), their targets not (the snapshot).  The
        # user's own start-up jobs may have replaced one with a file since (tfmp-home's record).
        owners = exec_in(name, "bash", "-c", "cd /home/tf && stat -c '%u %N' \"$@\"", "bash",
                         *links).stdout.splitlines()
        assert len(owners) == len(links) and all(o.startswith("4500 ") for o in owners), owners
        assert sum(" -> " in o for o in owners) >= len(links) - 1, owners
        # Owner and group, the user's own files too (QA: ~/project and f.txt kept GID 1000);
        # the file system mounted below the home is not walked.
        wrong = exec_in(name, "find", HOME, "-path", f"{HOME}/data", "-prune", "-o", "(", "!",
                        "-uid", "4500", "-o", "!", "-gid", "4500", ")", "-printf",
                        "%u:%g %p\n").stdout
        assert wrong == "", wrong
        mounted = exec_in(name, "stat", "-c", "%u", f"{HOME}/data", f"{HOME}/data/f.txt").stdout
        assert mounted.split() == ["1000", "1000"], mounted
    finally:
        if name:  # the volume can go only with the container that uses it
            run(["docker", "rm", "-f", "-v", name], check=False, timeout=60)
        run(["docker", "volume", "rm", "-f", volume, data], check=False, timeout=60)


def test_a_bind_mounted_home_of_another_uid_is_never_re_owned(image, tmp_path):
    """Item 2: a host folder of UID 1234 on /home/tf with the default NB_UID is refused with
    one line naming its owner and NB_UID, and nothing in it changes owner; with NB_UID=1234
    it is used as it is, and a file of another UID in it (1000, the image's own UID, which
    `usermod -u` would re-own) keeps its owner."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh/id_ed25519").write_text("not really a key\n")
    (home / ".ssh/id_ed25519").chmod(0o600)
    (home / "notes.txt").write_text("mine\n")
    (home / "from-uid-1000.txt").write_text("someone else's\n")
    for path in [home, *home.rglob("*")]:
        os.chown(path, 1234, 1234)
    os.chown(home / "from-uid-1000.txt", 1000, 1000)

    def owners() -> dict:
        return {str(p.relative_to(home)): (p.lstat().st_uid, p.lstat().st_gid)
                for p in [home, *home.rglob("*")]}

    before = owners()
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-v", f"{home}:{HOME}", command=["true"],
                      timeout=120)
    fatal = [line for line in proc.stderr.splitlines() if " FATAL " in line]
    assert proc.returncode == 64 and len(fatal) == 1, (proc.returncode, proc.stderr[-2000:])
    assert ("the home /home/tf belongs to UID 1234, not NB_UID=1000: set NB_UID=1234 "
            "(and NB_GID=1234) or mount a folder of UID 1000") in fatal[0], fatal
    assert owners() == before

    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-e", "NB_UID=1234", "-e", "NB_GID=1234",
                      "-v", f"{home}:{HOME}", command=["id", "-u"], timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "1234", proc.stderr[-2000:]
    after = owners()
    assert {p: after[p] for p in before} == before
    # What the start added (the image's files, as the user) is the user's.
    assert {after[p] for p in set(after) - set(before)} == {(1234, 1234)}, after


def test_a_workspace_of_another_user_is_refused_not_taken(image, tmp_path):
    """A host folder of UID 1234 on /workspace, started without NB_UID (UID 1000, who may not
    write there): one FATAL line naming its owner, before any change, even when another
    setting is bad too; the folder keeps its owner.  With NB_UID=1234 it is used as it is."""
    ws = tmp_path / "ws"
    ws.mkdir()
    ws.chmod(0o755)
    os.chown(ws, 1234, 1234)
    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-e", "JUPYTER_TLS=bogus",
                      "-v", f"{ws}:/workspace", command=["true"], timeout=120)
    fatal = [line for line in proc.stderr.splitlines() if " FATAL " in line]
    assert proc.returncode == 64 and len(fatal) == 1, (proc.returncode, proc.stderr[-2000:])
    assert ("the workspace /workspace belongs to UID 1234, not NB_UID=1000, and UID 1000 may "
            "not write there: set NB_UID=1234 (and NB_GID=1234)") in fatal[0], fatal
    assert (ws.stat().st_uid, ws.stat().st_gid) == (1234, 1234)

    proc = docker_run(image, "-e", "TFMP_QUIET=1", "-e", "NB_UID=1234", "-e", "NB_GID=1234",
                      "-v", f"{ws}:/workspace", command=["touch", "/workspace/mine"],
                      timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ((ws / "mine").stat().st_uid, ws.stat().st_uid) == (1234, 1234)


def test_a_job_without_ids_does_not_take_the_home_volume_of_another_uid(image):
    """The home volume re-owned for NB_UID=4600 (a stack of that user), then a `docker run`
    job that mounts it and forgot NB_UID: one FATAL line naming the home's owner, and the home
    stays 4600's (re-owning it would take it from under the running stack)."""
    volume = f"tfmp-home-ids-{uuid.uuid4().hex[:8]}"
    try:
        mount = ["-e", "TFMP_QUIET=1", "-v", f"{volume}:{HOME}"]
        given = ["-e", "NB_UID=4600", "-e", "NB_GID=4600"]
        first = docker_run(image, *mount, *given, command=["true"], timeout=120)
        assert first.returncode == 0 and "re-owned /home/tf for UID 4600" in first.stderr, \
            first.stderr[-2000:]
        proc = docker_run(image, *mount, command=["true"], timeout=120)
        fatal = [line for line in proc.stderr.splitlines() if " FATAL " in line]
        assert proc.returncode == 64 and len(fatal) == 1, (proc.returncode, proc.stderr[-2000:])
        assert ("the home /home/tf belongs to UID 4600 (GID 4600) and no NB_UID was given: "
                "set NB_UID=4600 and NB_GID=4600") in fatal[0], fatal
        again = docker_run(image, *mount, *given, command=["stat", "-c", "%u:%g", HOME],
                           timeout=120)
        assert again.stdout.strip() == "4600:4600" and "re-owned" not in again.stderr, \
            again.stderr[-2000:]
    finally:
        run(["docker", "volume", "rm", "-f", volume], check=False, timeout=60)
