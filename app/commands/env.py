"""``tfmp env``: versions and hardware, for bug reports, and the settings this environment
gives every run (the TFMP_ variables and TF_CONFIG), each checked as ``train`` checks it."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Mapping


def add_parser(subparsers):
    p = subparsers.add_parser("env", help="print TF/Keras/CUDA versions, GPUs, the auto precision, "
                              "which layer kinds mixed_bfloat16 runs here, and the settings the "
                              "environment gives (TFMP_ variables, TF_CONFIG); exit 2 when one "
                              "of those is not valid")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def environment_settings(environ: Mapping[str, str]) -> Dict[str, Any]:
    """What the environment sets for every run: ``variables`` (each set TFMP_ setting and
    its value as ``train`` reads it), ``tf_config`` (what TF_CONFIG makes of this process)
    and ``errors`` (one ``error:`` line a variable that ``train`` would refuse)."""
    from app.core.errors import UsageError
    from app.training.config import variable_settings
    from app.training.distribute import parse_tf_config

    variables, refused = variable_settings(environ)
    errors = [str(exc) for exc in refused]
    try:
        cluster = parse_tf_config(environ.get("TF_CONFIG"))
        tf_config = ("unset: one worker" if cluster is None else
                     f"a cluster of {cluster.num_workers} worker(s); this process is "
                     f"{cluster.task} ({'the chief' if cluster.is_chief else 'not the chief'})")
    except UsageError as exc:
        tf_config = None
        errors.append(str(exc))
    return {"variables": variables, "tf_config": tf_config, "errors": errors}


def settings_lines(env: Mapping[str, Any]) -> list:
    lines = ["Settings from the environment (flags override them):"]
    for name, value in env["variables"].items():
        lines.append(f"  {name}={value!r}" if value is not None else f"  {name}: not valid")
    if not env["variables"]:
        lines.append("  no TFMP_ setting is set")
    lines.append(f"  TF_CONFIG: {env['tf_config'] or 'not valid'}")
    return lines


def run(args) -> int:
    from app.core.exit_codes import EXIT_OK, EXIT_USAGE
    from app.machine import envreport

    report = envreport.collect(probe=True)
    report["environment"] = environment_settings(os.environ)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        print(envreport.format_text(report))
        print("\n".join(settings_lines(report["environment"])))
    for line in report["environment"]["errors"]:
        print(line, file=sys.stderr)
    return EXIT_USAGE if report["environment"]["errors"] else EXIT_OK
