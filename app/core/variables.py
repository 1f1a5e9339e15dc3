"""Every ``TFMP_`` variable the project reads, in one list, and the warning for a set one
that is none of them but close to one: a misspelled setting was ignored without a word,
and the run trained with the default.

The training settings' variables come from ``app.core.settings``; the others are read by
the image (entrypoint.sh, docker/, Dockerfile, docker-compose.yml) or by app/ outside the
settings.  tests/unit/core/test_variables.py greps those files for every ``TFMP_`` name, so
a variable added there and not here fails a test.  No TensorFlow here.
"""
from __future__ import annotations

import difflib
import os
import sys
from typing import List, Mapping, Optional, Tuple

from app.core import settings

# Read outside the settings table: the image's start-up and build, and app/ itself.
OTHER_VARIABLES = (
    "TFMP_COMMANDS",            # entrypoint.sh: the tfmp commands it runs as batch jobs
    "TFMP_CONSTRAINTS",         # docker/bin/tfmp-home: the pip constraints file it checks
    "TFMP_GPU_PROFILING",       # entrypoint.sh (the profiler's capability), app/machine
    "TFMP_IMAGE_VERSION",       # Dockerfile, the start-up banner
    "TFMP_JUPYTER_BASE_URL",    # the Jupyter server's settings (docker/config, docker/start)
    "TFMP_JUPYTER_CERTFILE",
    "TFMP_JUPYTER_KEYFILE",
    "TFMP_JUPYTER_MODE",
    "TFMP_JUPYTER_PORT",
    "TFMP_JUPYTER_TOKEN_PATH",
    "TFMP_LOGICAL_CPUS",        # app/training/distribute.py: a CPU split into N devices
    "TFMP_PIP_VERSION",         # docker/build/pip-install.sh: the pip the build installs
    "TFMP_QUIET",               # docker/start: no banner before batch commands
    "TFMP_TENSORBOARD_LOGDIR",  # docker/start: the folder JupyterLab's TensorBoard shows
)

KNOWN = tuple(sorted({s.env for s in settings.SETTINGS if s.env} | set(OTHER_VARIABLES)))

_warned: set = set()   # names already warned of: a notebook calling app.train again is not


def misspellings(environ: Mapping[str, str]) -> List[Tuple[str, str]]:
    """(set variable, the known one it is close to) for each set ``TFMP_`` variable that is
    not known.  Compared without the prefix, which every name shares: a variable like no
    known one (a user's own, as the image's tests pass to a container) is no misspelling
    and is left alone."""
    tails = {name[len(settings.ENV_PREFIX):]: name for name in KNOWN}
    found = []
    for name in sorted(environ):
        if not name.startswith(settings.ENV_PREFIX) or name in KNOWN:
            continue
        close = difflib.get_close_matches(name[len(settings.ENV_PREFIX):].upper(), tails, n=1)
        if close:
            found.append((name, tails[close[0]]))
    return found


def warn_of_misspellings(environ: Optional[Mapping[str, str]] = None) -> None:
    """One ``warning:`` line on stderr for each misspelled variable, once per process; the
    command goes on (the variable may be meant for something else)."""
    for name, known in misspellings(os.environ if environ is None else environ):
        if name in _warned:
            continue
        _warned.add(name)
        print(f"warning: {name} is not a variable tfmp reads, so it is ignored; did you mean "
              f"{known}?", file=sys.stderr, flush=True)
