"""Names, settings, errors, exit codes, atomic files and child processes: no TensorFlow, no other layer."""
