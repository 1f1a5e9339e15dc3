"""One ``tfmp train`` set-up, built through the seams ``train`` uses
(``app.training.job.prepare``/``build_parts``/``make_recorder``/``make_monitor``) and driven
as its loop drives it: what bench_sentinel and bench_accumulate time, side by side
(``interleave.py``)."""
from __future__ import annotations


class TrainSetup:
    def __init__(self, cfg):
        """``cfg``: an ``app.training.config.TrainConfig`` (one epoch, synthetic data)."""
        from app.training import distribute, job, step

        self.run = job.prepare(cfg)
        self.parts = job.build_parts(self.run)
        recorder = job.make_recorder(self.run, self.parts, {}).open()
        self.monitor = job.make_monitor(self.run, self.parts, recorder)
        self.loop = cfg.loop
        if self.loop == "fit":   # as run_fit compiles it (a group's micro-batches in one call)
            self.per_call = step.fit_steps_per_execution(self.run.config, self.run.dist.replicas)
            step.compile_for_fit(self.parts, cfg.jit, self.per_call)
        else:
            self.custom = step.CustomSteps(self.parts, cfg.jit)
            self.data = distribute.distribute_dataset(self.run.dist, self.run.bundle.train)
        self.batches = None

    def epoch(self):
        """One epoch, as ``train`` runs it (the warm-up: every trace made)."""
        if self.loop == "fit":
            with self.monitor.polling(self.parts.model):
                self.parts.model.fit(self.run.bundle.train, epochs=1, verbose=0, shuffle=False)
            self.monitor.raise_pending()
            return
        for x, y in self.data:
            self.custom.train_step(x, y)
            self.monitor.tick(0)

    def steps(self, n: int = 1):
        """``n`` training steps (micro-batches under --accumulate), as the loop takes them:
        fit through Keras' own train function, ``per_call`` steps a call; the custom loop
        through its step and the monitor's tick."""
        if self.loop == "fit":
            if self.batches is None:
                self.batches = iter(self.run.bundle.train.repeat())
            for _ in range(-(-n // self.per_call)):
                self.parts.model.train_function(self.batches)
            return
        if self.batches is None:
            self.batches, self.next = list(self.data), 0
        for _ in range(n):
            x, y = self.batches[self.next % len(self.batches)]
            self.next += 1
            self.custom.train_step(x, y)
            self.monitor.tick(0)

    def updates(self) -> int:
        """Optimizer updates so far (the step statistics count updates, not micro-batches)."""
        return int(self.parts.stats.steps.numpy())
