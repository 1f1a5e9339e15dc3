"""Names, settings, errors, exit codes, argparse, atomic files and child processes: no
TensorFlow, no other layer."""
