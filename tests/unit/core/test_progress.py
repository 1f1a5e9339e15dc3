"""app.core.progress: tqdm's bar on a terminal, plain lines in a log, a widget in a notebook;
every message a whole line in each mode.  The tuner's progress is drawn with it."""
from __future__ import annotations

import io
import types

from app.core import progress
from app.tuner.progress import Progress


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_mode_follows_the_stream_and_the_kernel():
    assert progress.mode(io.StringIO()) == "lines"
    assert progress.mode(Tty()) == "bar"
    assert progress.mode(io.StringIO(), notebook=True) == "widget"


def test_lines_mode_writes_the_messages_only():
    out = io.StringIO()
    bar = progress.Bar(3, "run", out)
    bar.label("float32 #1")
    bar.advance()
    bar.line("[benchmark] run 1/3 ...")
    bar.close()
    assert out.getvalue() == "[benchmark] run 1/3 ...\n"


def test_bar_mode_is_tqdm_with_messages_above_it():
    out = Tty()
    bar = progress.Bar(2, "trial", out, desc="tune")
    bar.label("trying float32 at batch 64")
    bar.line("[tune] float32 batch 64: fits")
    bar.advance(3)                      # more than expected: the total grows
    bar.close()
    text = out.getvalue()
    assert "[tune] float32 batch 64: fits\n" in text
    assert "tune:" in text and "/2 " in text and "trial/s" in text   # tqdm drew its bar
    assert bar.done == 3


def test_tuner_progress_lines_in_a_log():
    out = io.StringIO()
    p = Progress(4, out, tty=False)
    trial = types.SimpleNamespace(batch_size=64, fits=True, peak_memory_bytes=300 * 2**20,
                                  samples_per_second=1234.0, seconds=2.0, reason=None)
    p.start("float32", 64)
    p.finish("float32", trial)
    verified = types.SimpleNamespace(**dict(vars(trial), phase="verify", samples_per_second=12.0))
    p.start("float32", 64, "verify")
    p.finish("float32", verified)
    p.say("[tune] done")
    p.close()
    assert out.getvalue().splitlines() == [
        "[tune] float32         batch    64: fits, peak 300 MiB, 1,234 samples/s (2 s)",
        # one short epoch's rate counts the tracing: not shown beside the trials'
        "[tune] float32         batch    64: in one epoch of tfmp train: fits, peak 300 MiB "
        "(2 s)",
        "[tune] done"]
    assert p.done == 2
