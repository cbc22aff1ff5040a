"""Progress bars: rich bars on stderr when it is a terminal, nothing otherwise.

Bars show only inside a `bars()` block (the `superopt` command opens one around each command), so a
library call stays quiet unless its caller asks:

    with progress.bars():          # bars when stderr is a terminal
        fast.compile(*args)        # saturation shows its phase and iteration

Code that does long work asks for a `task` and advances it; outside a `bars()` block, or when stderr is
not a terminal, a task is a no-op.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys

_live: contextvars.ContextVar = contextvars.ContextVar("superopt_progress", default=None)


def interactive(stream=None) -> bool:
    """Whether `stream` (stderr by default) is a terminal a bar can redraw."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def bars(enabled: bool | None = None):
    """Show tasks started in this block as bars; `enabled` defaults to whether stderr is a terminal."""
    if not (interactive() if enabled is None else enabled):
        token = _live.set(None)
        try:
            yield None
        finally:
            _live.reset(token)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as live:
        token = _live.set(live)
        try:
            yield live
        finally:
            _live.reset(token)


class Task:
    """One bar; every method is a no-op when no bar is shown."""

    def __init__(self, description: str, total: float | None, transient: bool):
        self.live, self.transient = _live.get(), transient
        self.id = self.live.add_task(description, total=total) if self.live is not None else None

    def update(self, description: str | None = None, *, completed: float | None = None,
               total: float | None = None, advance: float | None = None) -> None:
        if self.live is None:
            return
        fields = {k: v for k, v in dict(description=description, completed=completed, total=total,
                                          advance=advance).items() if v is not None}
        self.live.update(self.id, **fields)

    def advance(self, description: str | None = None, n: float = 1) -> None:
        self.update(description, advance=n)

    def close(self) -> None:
        if self.live is not None and self.transient:
            self.live.remove_task(self.id)
        self.live = None

    def __enter__(self) -> "Task":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def task(description: str, total: float | None = None, transient: bool = False) -> Task:
    """A bar in the enclosing `bars()` block (a no-op outside one); `transient` bars vanish when closed."""
    return Task(description, total, transient)


def active() -> bool:
    """Whether bars are being shown."""
    return _live.get() is not None


def note(text: str) -> None:
    """A line above the bars (what a long step is doing); nothing when no bars are shown."""
    live = _live.get()
    if live is not None:
        live.console.print(text, highlight=False, markup=False)
