"""The progress of a distributed run: a table of variants x stages (state, node, time).

Shown live while the run goes (rich ``Live``) and printed once more at the end as the summary.
A shared task (one output for several variants) shows in every row that waits for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.text import Text

from pipeline.console import Table
from pipeline.fleet.graph import FleetGraph
from pipeline.fleet.task import BLOCKED, FAILED, GATED, RAN, SKIPPED, UNAVAILABLE, TaskReport

WAITING, QUEUED, RUNNING = "waiting", "queued", "running"
_STYLE = {
    WAITING: "dim",
    QUEUED: "cyan",
    RUNNING: "bold yellow",
    RAN: "green",
    SKIPPED: "green",
    FAILED: "bold red",
    GATED: "bold red",
    UNAVAILABLE: "yellow",
    BLOCKED: "dim",
}
_SHOWN = {SKIPPED: "up to date", BLOCKED: "not run"}


@dataclass
class Cell:
    state: str = WAITING
    node: str = ""
    started: float | None = None  # monotonic
    seconds: float | None = None  # when finished


@dataclass
class Board:
    """The driver's picture of every task, by key."""

    graph: FleetGraph
    cells: dict[str, Cell] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cells = {key: Cell() for key in self.graph.tasks}

    def queued(self, key: str) -> None:
        self.cells[key].state = QUEUED

    def running(self, key: str, node: str, started: float) -> None:
        cell = self.cells[key]
        if cell.state in (WAITING, QUEUED):
            cell.state, cell.node, cell.started = RUNNING, node, started

    def finished(self, report: TaskReport) -> None:
        cell = self.cells[report.key]
        cell.state, cell.seconds = report.state, report.seconds
        cell.node = report.node or cell.node

    def table(self, title: str) -> Table:
        table = Table(title=title, title_justify="left")
        table.add_column("variant")
        for column in self.graph.columns:
            table.add_column(column)
        now = time.monotonic()
        for variant in self.graph.variants:
            row: list[Text | str] = [variant]
            for column in self.graph.columns:
                key = self.graph.cells.get((variant, column))
                row.append(self._render(self.cells[key], now) if key else Text("-", style="dim"))
            table.add_row(*row)
        return table

    @staticmethod
    def _render(cell: Cell, now: float) -> Text:
        seconds = cell.seconds if cell.seconds is not None else (now - cell.started if cell.started else None)
        parts = [_SHOWN.get(cell.state, cell.state)]
        if cell.node:
            parts.append(cell.node.split()[-1])  # the IP: short enough for a cell
        if seconds is not None:
            parts.append(f"{seconds:.1f}s")
        return Text(" ".join(parts), style=_STYLE.get(cell.state, ""))
