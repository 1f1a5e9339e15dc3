"""The persistent home (issue 18, part 1; docs/image.md "What persists"), as a user lives
it: things installed and configured over SSH and through JupyterLab, then `docker compose
down` (volumes kept) and `up` on a rebuilt image with another NB_UID, then a user-site
numpy 2 that would break TensorFlow.  One test with its own stack, because it takes the
stack down and up (each start costs seconds on these machines)."""
from __future__ import annotations

import json
import re
import shlex
import textwrap
from pathlib import Path

import pytest
import requests

from image_helpers import HOST_GID, HOST_UID, exec_in, kernel_execute, run, wait_until
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
