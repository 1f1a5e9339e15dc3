"""What a run leaves in its output folder: checkpoints, the one-run lock, write faults."""
