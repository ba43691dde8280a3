"""A byte/step progress bar for long stage bodies (rich, to the terminal only)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn


@contextmanager
def byte_progress(description: str) -> Iterator[Callable[[int, int], None]]:
    """Yields ``update(done_bytes, total_bytes)``; the bar disappears when the block ends."""
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update
