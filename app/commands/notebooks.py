"""``tfmp notebooks``: list the guide notebooks, or seed a folder with them.

    tfmp notebooks                           where the shipped notebooks are
    tfmp notebooks --install DIR             copy them into DIR; never overwrites a
                                             notebook you changed (see app/notebooks)

The image's start-up runs ``--install /workspace/notebooks`` as the unprivileged user.
"""
from __future__ import annotations

from app.core.settings import non_empty


def add_parser(subparsers):
    p = subparsers.add_parser(
        "notebooks", help="list the guide notebooks, or copy them into a folder",
        description="The mixed-precision guide notebooks shipped with the package. With "
                    "--install, copy the missing ones into DIR and refresh copies you never "
                    "changed; a notebook you edited is never overwritten.")
    p.add_argument("--install", type=non_empty, metavar="DIR", default=None,
                   help="folder to copy the notebooks into (created if missing)")
    return p


def run(args) -> int:
    from app import notebooks

    if args.install is None:
        print(f"notebooks shipped in {notebooks.SOURCE_DIR}:")
        for name in notebooks.shipped():
            print(f"  {name}")
        return 0
    for outcome in notebooks.install(args.install):
        print(f"{args.install}/{outcome.line()}")
    return 0
