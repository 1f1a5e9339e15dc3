"""Progress across many child runs (``tfmp tune``'s trials, ``tfmp benchmark``'s runs), drawn
by tqdm: a bar on a terminal, a widget in a notebook (``tqdm.auto``; the image has
ipywidgets, without which tqdm's notebook bar fails with "IProgress not found"), plain lines
in a log or a pipe.  Every message is a whole line in each mode, above the bar.

``mode()`` decides; ``Bar`` is the one object the features use.  tqdm is imported only when
a bar is drawn; without it the lines are written plainly.  No TensorFlow here.
"""
from __future__ import annotations

import sys
from typing import Optional, TextIO

MODES = ("bar", "widget", "lines")


def in_notebook() -> bool:
    """Running in a Jupyter kernel (ipykernel's shell), which draws widgets."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
    except Exception:
        return False
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def _widgets_available() -> bool:
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def mode(stream: TextIO, tty: Optional[bool] = None, notebook: Optional[bool] = None) -> str:
    """``widget`` in a notebook kernel with ipywidgets, ``bar`` on a terminal, else ``lines``."""
    if notebook is None:
        notebook = in_notebook() and _widgets_available()
    if notebook:
        return "widget"
    isatty = getattr(stream, "isatty", lambda: False)
    return "bar" if (isatty() if tty is None else tty) else "lines"


class Bar:
    """``total`` steps of ``unit``; ``advance()`` one, ``label()`` what runs now, ``line()``
    a message kept above the bar, ``close()``."""

    def __init__(self, total: int, unit: str, stream: Optional[TextIO] = None,
                 how: Optional[str] = None, enabled: bool = True, desc: str = ""):
        self.stream = stream or sys.stderr
        self.how = how or mode(self.stream)
        self.enabled = enabled
        self.total = max(1, int(total))
        self.done = 0
        self._bar = None
        if enabled and self.how in ("bar", "widget"):
            try:
                if self.how == "widget":
                    from tqdm.notebook import tqdm
                else:
                    from tqdm import tqdm
            except ImportError:
                self.how = "lines"
            else:
                kw = {} if self.how == "widget" else {"file": self.stream, "dynamic_ncols": True}
                self._bar = tqdm(total=self.total, unit=unit, desc=desc, leave=False, **kw)

    def label(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            if self.done > self._bar.total:
                self._bar.total = self.done
            self._bar.update(n)

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None and self.how == "bar":
            self._bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
