"""Subcommands of ``tfmp``.

Each module exposes ``add_parser(subparsers)`` and ``run(args) -> int``.  To add a command,
write the module and add its name to ``COMMANDS``; nothing else needs to change.
"""
COMMANDS = ["train", "env", "benchmark", "notebooks", "check", "tune"]
