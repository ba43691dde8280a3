"""Tables read in a CI log: no terminal, nobody resizes it; every candidate's name is there in full."""

from __future__ import annotations

import io
import json

import pytest

from pipeline.commands.evaluate import summary_table
from pipeline.console import UNBOUNDED, console_width, make_console
from tests.ci.conftest import SPEC


@pytest.fixture(autouse=True)
def no_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)


def test_width_follows_the_terminal_or_columns_or_the_table():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert console_width(Tty(), {}) is None  # rich asks the terminal
    assert console_width(io.StringIO(), {"COLUMNS": "132"}) == 132
    assert console_width(io.StringIO(), {}) == UNBOUNDED
    assert console_width(io.StringIO(), {"COLUMNS": "wide"}) == UNBOUNDED


def test_evaluation_table_without_a_terminal_has_every_candidate_in_full(recorded):
    out = io.StringIO()
    make_console(file=out, environ={}).print(summary_table(recorded))
    text = out.getvalue()
    assert "…" not in text
    for candidate in recorded["candidates"]:  # eagle[cpu_small_10_depth_3] was cut, or eaten as markup
        assert f" {candidate['name']} " in text, candidate["name"]


def test_evaluation_table_at_a_narrow_columns_wraps_instead_of_eliding(recorded):
    out = io.StringIO()
    make_console(file=out, environ={"COLUMNS": "60"}).print(summary_table(recorded))
    lines = out.getvalue().splitlines()
    assert "…" not in out.getvalue() and max(len(line) for line in lines) <= 60
    first_column = "".join(line.split("│")[1].strip() for line in lines if line.startswith("│"))
    for candidate in recorded["candidates"]:
        assert candidate["name"].replace(" ", "") in first_column.replace(" ", ""), candidate["name"]


def test_plan_and_report_through_a_pipe_show_the_measured_choice_in_full(cli, evaluated, recorded):
    # The choice as it reads with a tree candidate; plan and report print what the evaluation recorded.
    chosen = "eagle[cpu_small_10_depth_3]"
    recorded["choice"] |= {"candidate": chosen, "reason": f"{chosen}: predicted 1.51x on l40s at batch 1"}
    (evaluated / "evaluation.json").write_text(json.dumps(recorded))
    rc, out, err = cli("plan", str(SPEC))
    assert rc == 0, err
    assert "…" not in out
    assert f"measured choice │ {chosen}: {chosen}: predicted 1.51x on l40s at batch 1" in out
    rc, out, err = cli("report", str(SPEC))
    assert rc == 0 and "…" not in out, err
    assert f"│ {chosen} │" in out and f"{chosen}: predicted 1.51x on l40s at batch 1 │" in out


def test_the_fleet_progress_table_wraps_a_long_variant_name(write_spec, tmp_path):
    # The `engine --ray` table of variants x stages: a variant column that never wrapped cropped the name and
    # squeezed the stage columns to nothing at a narrow width.
    from pipeline.fleet.graph import build_graph
    from pipeline.fleet.view import Board
    from pipeline.plan.planner import make_plan
    from pipeline.plan.types import OutputRoots
    from pipeline.spec.document import load_spec

    name = "code-lookahead-with-a-long-name"
    spec = write_spec(f"name: fleet\nmodel: {{builtin: smollm2-135m-instruct}}\nvariants:\n  - name: {name}\n")
    roots = OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", tmp_path / "cache")
    board = Board(build_graph(make_plan(load_spec(spec), roots)))
    out = io.StringIO()
    make_console(file=out, environ={"COLUMNS": "40"}).print(board.table("fleet"))
    rows = [line.split("│")[1:-1] for line in out.getvalue().splitlines() if line.startswith("│")]
    assert "".join(row[0].strip() for row in rows) == name
    assert "".join(row[1].strip() for row in rows) == "waiting"  # the stage columns keep their text too
