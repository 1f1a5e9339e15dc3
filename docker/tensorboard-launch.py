#!/usr/bin/env python3
"""TensorBoard for JupyterLab's "TensorBoard" tile (installed as /usr/local/bin/tfmp-tensorboard).

    tfmp-tensorboard --port PORT   run TensorBoard on 127.0.0.1:PORT over the runs folder
    tfmp-tensorboard --check       print the runs folder, or one line saying what is wrong

jupyter-server-proxy starts it on the first request to <base_url>/tensorboard/ (see
/etc/jupyter/jupyter_server_config.py) with a free port; it listens on 127.0.0.1 only, so
the browser reaches it through Jupyter, behind the token.

The runs folder: TFMP_TENSORBOARD_LOGDIR if set, else $TFMP_WORKSPACE/runs, which is where
`python -m app train` writes every run by default, so each run shows up without settings.
It is created when missing (a fresh workspace): TensorBoard then shows runs as they appear.
A URL TensorBoard reads itself (gs://bucket/runs) is passed through unchecked.

For a local folder TensorBoard runs without TensorFlow: its own event reader and data server
read the files, and importing TensorFlow (which only its What-If Tool plugin asks for) took
5-12 s of the first open on 2 cores and ~250 MB of memory.  This is TensorBoard's own
standalone mode ("reduced feature set"); the scalars page is what the image tests check.
The What-If Tool and Debugger V2 need TensorFlow (`tensorboard --logdir ...` in a terminal
has it).  A URL keeps TensorFlow, which reads gs://.
"""
import importlib.abc
import os
import re
import sys
import types

ENV_VAR = "TFMP_TENSORBOARD_LOGDIR"
ALLOWED = "an absolute folder path (e.g. /workspace/runs) or a URL such as gs://bucket/runs"
USAGE = "usage: tfmp-tensorboard --port PORT | --check"


class BadSetting(Exception):
    """One line for the user: what was wrong and what is allowed."""


def default_logdir(environ) -> str:
    return os.path.join(environ.get("TFMP_WORKSPACE") or "/workspace", "runs")


def resolve_logdir(environ) -> str:
    """The runs folder to serve, created if missing; BadSetting names what is wrong."""
    if ENV_VAR not in environ:
        value, origin = default_logdir(environ), "TFMP_WORKSPACE/runs"
    else:
        value, origin = environ[ENV_VAR], ENV_VAR
        if not value:
            raise BadSetting(f"{ENV_VAR} is set but empty; allowed: {ALLOWED} "
                             f"(unset it for {default_logdir(environ)})")
    if any(ord(ch) < 32 for ch in value):
        raise BadSetting(f"{origin} contains a control character; allowed: {ALLOWED}. "
                         f"Received: {value!r}")
    if is_url(value):
        return value
    if not os.path.isabs(value):
        raise BadSetting(f"{origin} must be an absolute path; allowed: {ALLOWED}. "
                         f"Received: {origin}={value!r}")
    if os.path.exists(value) and not os.path.isdir(value):
        raise BadSetting(f"{origin}={value!r} is a file, not a folder; allowed: {ALLOWED}")
    try:
        os.makedirs(value, exist_ok=True)
    except OSError as exc:
        raise BadSetting(f"{origin}={value!r} cannot be created ({exc.strerror}); allowed: "
                         f"{ALLOWED}, readable by this user") from None
    if not os.access(value, os.R_OK | os.X_OK):
        raise BadSetting(f"{origin}={value!r} is not readable by this user; allowed: {ALLOWED}, "
                         "readable by this user")
    return os.path.normpath(value)


def is_url(logdir: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*://", logdir) is not None


class _WithoutTensorFlow(importlib.abc.MetaPathFinder):
    """Makes `import tensorflow` fail fast, so TensorBoard falls back to its own stub."""

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ModuleNotFoundError(f"{name} is not used by this TensorBoard", name=name)
        return None


def run_tensorboard(logdir: str, port: int) -> None:
    if not is_url(logdir):
        # tensorboard.compat picks its TensorFlow stub when this marker module exists.
        sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
        sys.meta_path.insert(0, _WithoutTensorFlow())
        print(f"tfmp-tensorboard: {logdir} on 127.0.0.1:{port}, without TensorFlow (not needed "
              "for local event files; TensorBoard calls this its reduced feature set)",
              file=sys.stderr, flush=True)
    # No --path_prefix: the proxy strips /tensorboard/ and TensorBoard's pages use relative URLs.
    sys.argv = ["tensorboard", "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port)]
    from tensorboard.main import run_main

    run_main()


def parse_args(argv):
    """('check', None) or ('serve', port); BadSetting for anything else."""
    if argv == ["--check"]:
        return "check", None
    if len(argv) == 2 and argv[0] == "--port":
        if argv[1].isdigit() and 0 < int(argv[1]) < 65536:
            return "serve", int(argv[1])
        raise BadSetting(f"--port must be a number from 1 to 65535. Received: {argv[1]!r}")
    raise BadSetting(f"{USAGE}. Received: {' '.join(argv) or '(nothing)'}")


def main(argv) -> int:
    try:
        mode, port = parse_args(argv)
        logdir = resolve_logdir(os.environ)
    except BadSetting as exc:
        print(f"tfmp-tensorboard: {exc}", file=sys.stderr)
        return 2
    if mode == "check":
        print(logdir)
        return 0
    run_tensorboard(logdir, port)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
