"""How to train: the configuration, the job, the one step, the loops, monitor, recorder, interrupts, distribution."""
