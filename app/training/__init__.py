"""How to train: the configuration, a tune's use, the job, the one step, its statistics, the
loops, monitor, recorder, interrupts and distribution."""
