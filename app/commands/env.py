"""``tfmp env``: versions and hardware, for bug reports."""
from __future__ import annotations

import json


def add_parser(subparsers):
    p = subparsers.add_parser("env", help="print TF/Keras/CUDA versions, GPUs, the auto precision "
                              "and which layer kinds mixed_bfloat16 runs here")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def run(args) -> int:
    from app.machine import envreport

    report = envreport.collect(probe=True)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(envreport.format_text(report))
    return 0
