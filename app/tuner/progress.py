"""Progress across all trials of a tune: ``app.core.progress.Bar`` (tqdm: a bar on a
terminal, a widget in a notebook, plain lines in a log), with one line per finished trial."""
from __future__ import annotations

from typing import Optional, TextIO

from app.core.progress import Bar
from app.machine.memory import format_size


class Progress:
    def __init__(self, expected: int, stream: Optional[TextIO] = None,
                 tty: Optional[bool] = None, enabled: bool = True, how: Optional[str] = None):
        if how is None and tty is not None:
            how = "bar" if tty else "lines"
        self.bar = Bar(expected, "trial", stream, how=how, enabled=enabled, desc="tune")
        self.enabled = enabled

    @property
    def tty(self) -> bool:
        return self.bar.how != "lines"

    @property
    def done(self) -> int:
        return self.bar.done

    def start(self, policy: str, batch_size: int, phase: str = "search") -> None:
        what = "verifying" if phase == "verify" else "trying"
        self.bar.label(f"{what} {policy} at batch {batch_size}")

    def finish(self, policy: str, trial) -> None:
        self.bar.advance()
        # The verification is one short epoch of `tfmp train`: its rate counts the step's
        # tracing, so it is no measure of speed (the trials' is) and is not shown.
        verify = getattr(trial, "phase", "search") == "verify"
        rate = ("" if verify or not trial.fits
                else f", {trial.samples_per_second:,.0f} samples/s")
        self.bar.line(
            f"[tune] {policy:<15} batch {trial.batch_size:>5}: "
            + ("in one epoch of tfmp train: " if verify else "")
            + (f"fits, peak {format_size(trial.peak_memory_bytes)}{rate}" if trial.fits else
               f"does not fit: {trial.reason}")
            + (f" ({trial.seconds:.0f} s)" if trial.seconds else ""))

    def say(self, text: str) -> None:
        self.bar.line(text)

    def close(self) -> None:
        self.bar.close()
