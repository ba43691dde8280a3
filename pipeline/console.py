"""Where specdeploy's tables and lines go, and how wide they may be.

One place decides the width of every rich console the CLI makes (:func:`make_console`):

* stdout (or stderr) is a terminal: rich's own choice, the terminal's width (``COLUMNS`` when set);
* it is not (a CI log, a pipe, a file): ``COLUMNS`` when set, else wide enough for any table
  (:data:`UNBOUNDED`), because nobody resizes a CI log and rich's default of 80 columns cut the
  candidates' names to ``looka…``.

Tables made with :class:`Table` wrap a cell's text onto more lines (``overflow="fold"``) when the width
is too small, instead of eliding it with "…", so every name is there in full at any width:

    >>> import io
    >>> out = io.StringIO()
    >>> console = make_console(file=out, environ={"COLUMNS": "14"})
    >>> table = Table()
    >>> table.add_column("candidate")
    >>> table.add_row("lookahead(4,3,4)")
    >>> console.print(table)
    >>> print(out.getvalue().strip())
    ┏━━━━━━━━━━━━┓
    ┃ candidate  ┃
    ┡━━━━━━━━━━━━┩
    │ lookahead( │
    │ 4,3,4)     │
    └────────────┘

Cell text is rich markup: a name in square brackets (``eagle[mc_sim_7b_63]``) goes through
``rich.markup.escape``, or it is taken for a style and vanishes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import IO, Any

import rich.table
from rich.console import Console

# Columns for a console that is not a terminal and has no COLUMNS: tables are never expanded, so each
# one takes its natural width, and lines are printed with soft wrap (never cut); this is only the bound.
UNBOUNDED = 10_000


def console_width(stream: IO[str], environ: Mapping[str, str] | None = None) -> int | None:
    """The width for a console writing to ``stream``: None (rich asks the terminal) on a terminal,
    else ``COLUMNS`` when it is a positive integer, else :data:`UNBOUNDED`."""
    environ = os.environ if environ is None else environ
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return None
    columns = environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return UNBOUNDED


def make_console(
    *, stderr: bool = False, file: IO[str] | None = None, environ: Mapping[str, str] | None = None, **kwargs: Any
) -> Console:
    """A rich Console for stdout (``stderr``: stderr, ``file``: that stream) whose width follows
    :func:`console_width`; lines are soft-wrapped (a long line is one line, as the CI log shows it)."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    return Console(file=file, stderr=stderr, width=console_width(stream, environ), soft_wrap=True, **kwargs)


class Table(rich.table.Table):
    """A rich table whose cells wrap (``overflow="fold"``) instead of being cut with "…"."""

    def add_column(self, *args: Any, overflow: Any = "fold", **kwargs: Any) -> None:
        super().add_column(*args, overflow=overflow, **kwargs)
