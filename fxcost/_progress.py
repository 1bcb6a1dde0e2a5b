"""The one progress display fxcost shows on long work: rich bars on stderr, gone when the work ends.

Example:
    >>> with progress_bars() as update:  # doctest: +SKIP
    ...     for i in range(10):
    ...         update("measuring", i + 1, 10)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

__all__ = ["Update", "progress_bars"]

Update = Callable[[str, int, int | None], None]
"""``update(label, done, total)``: one bar per label, created on first use; ``total=None`` spins."""


@contextlib.contextmanager
def progress_bars(enabled: bool = True) -> Iterator[Update]:
    """A transient progress display on stderr and its ``update`` function (which does nothing
    when ``enabled`` is False or stderr is not a terminal)."""
    from rich.console import Console

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:  # a log file or a pipe gets errors only, not redraws
        yield lambda label, done, total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        tasks: dict[str, object] = {}

        def update(label: str, done: int, total: int | None) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total)
            bar.update(tasks[label], completed=done, total=total)  # type: ignore[arg-type]

        yield update
