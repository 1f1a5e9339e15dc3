"""Unit tests of the command line (app/cli.py, app/commands/)."""
