"""Progress bars for long stage bodies and commands (rich, to the terminal only): what is running,
how far, how long left."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


@contextmanager
def byte_progress(description: str) -> Iterator[Callable[[int, int], None]]:
    """Yields ``update(done_bytes, total_bytes)``; the bar disappears when the block ends."""
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task(escape(description), total=None)  # "[variant]" is text, not a style

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update


@contextmanager
def step_progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(steps)`` towards ``total`` (tokens, batches, epochs); the bar disappears when the
    block ends, and a terminal that is not one (a CI log) gets nothing."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task(escape(description), total=total)  # "[variant]" is text, not a style

        def advance(steps: int) -> None:
            progress.advance(task, steps)

        yield advance
