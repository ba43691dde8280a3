"""The one flow of `specdeploy engine` (pipeline/commands/engine_run.py) around a stand-in runner: the
evaluate-first run and the plan made again, the rest only for the variants not stopped, each variant's
two runs joined, one line per failed release gate in the plan's order, the exit code, the CI records.
The two real runners are exercised end to end (tests/evaluation/test_stage.py, tests/fleet/test_ray.py)."""

from __future__ import annotations

import argparse
import io
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from pipeline.commands.engine_run import Stop, VariantRun, exit_code_of, run_engine
from pipeline.evaluation.result import GATE_FAILED
from pipeline.release.ci.records import NOT_RUN, RAN, UNAVAILABLE, StageRecord


@dataclass(frozen=True)
class Variant:
    name: str
    stages: tuple[SimpleNamespace, ...]
    method: str = "none"
    rehearsal: object | None = None
    speculative: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(reason="measured"))

    def stage(self, name: str) -> SimpleNamespace:
        return next(s for s in self.stages if s.name == name)


def _stages(*names: str) -> tuple[SimpleNamespace, ...]:
    return tuple(SimpleNamespace(name=n, output=Path("/out") / n) for n in names)


PLAN = SimpleNamespace(
    variants=(
        Variant("b", _stages("convert", "build")),  # planned first: its gate line comes first too
        Variant("a", _stages("evaluate", "build"), rehearsal=True),
        Variant("c", _stages("evaluate", "build"), rehearsal=True),
    )
)


def _ran(*stages: str) -> VariantRun:
    return VariantRun({s: RAN for s in stages}, tuple(StageRecord(s, RAN, 1.0) for s in stages), True)


def _stopped(stage: str, state: str, code: int, reason: str) -> VariantRun:
    stop = StageRecord(stage, state, None, reason)
    return VariantRun({stage: state}, (), False, Stop(state, code, reason), stop, code)


class Runner:
    """Stand-in StageRunner: answers each run from ``answers`` and remembers what it was asked."""

    def __init__(self, answers: dict[str, dict[str, VariantRun]]) -> None:
        self.answers, self.asked, self.plans, self.done = answers, [], 0, None

    def load_plan(self):
        self.plans += 1
        return PLAN

    def prepare(self, plan, only):
        self.asked.append(("prepare", set(only)))

    def run(self, plan, names):
        self.asked.append((plan, set(names)))
        return self.answers[plan]

    def say_done(self, runs, exit_code):
        self.done = (len(runs), exit_code)


@pytest.fixture
def flow(monkeypatch):
    import pipeline.evaluation.apply
    import pipeline.release.report

    monkeypatch.setattr(pipeline.release.report, "print_lora_decisions", lambda plan, console: None)
    monkeypatch.setattr(pipeline.evaluation.apply, "split_at_evaluate", lambda plan, only: ("first", lambda p: "rest"))
    console = Console(file=io.StringIO(), width=200)
    return lambda runner: (run_engine(argparse.Namespace(variant=None), console, runner), console.file.getvalue())


def test_the_flow_runs_the_rest_for_variants_not_stopped_and_joins_each_variants_runs(flow, capsys):
    runner = Runner(
        {
            "first": {"a": _ran("evaluate"), "c": _stopped("evaluate", GATE_FAILED, 6, "c misses the gate")},
            "rest": {"b": _stopped("build", GATE_FAILED, 6, "b misses the gate"), "a": _ran("build")},
        }
    )
    result, out = flow(runner)
    assert runner.asked == [("prepare", set()), ("first", set()), ("rest", {"a", "b"})]  # c stopped at its gate
    assert runner.plans == 2  # planned again after evaluate, so the choice is what is built
    err = capsys.readouterr().err
    assert "[a] method best: building none: measured" in out
    assert err.splitlines() == [
        "error: b: release gate failed: b misses the gate",
        "error: c: release gate failed: c misses the gate",
    ]
    assert result.exit_code == 6 and runner.done == (3, 6)
    assert result.states == {
        "b": {"build": GATE_FAILED},
        "a": {"evaluate": RAN, "build": RAN},
        "c": {"evaluate": GATE_FAILED},
    }
    records = {r.name: r for r in result.records}
    assert list(records) == ["b", "a", "c"]
    assert [(s.stage, s.state) for s in records["a"].stages] == [("evaluate", RAN), ("build", RAN)]
    assert [(s.stage, s.state) for s in records["c"].stages] == [("evaluate", GATE_FAILED), ("build", NOT_RUN)]
    assert records["c"].exit_code == 6 and records["a"].exit_code == 0


def test_a_stage_that_cannot_run_exits_3_unless_a_stage_failed():
    unavailable, gate = Stop(UNAVAILABLE, 3, "no GPU"), Stop(GATE_FAILED, 6, "gate")
    assert exit_code_of([]) == 0
    assert exit_code_of([unavailable]) == 3
    assert exit_code_of([unavailable, gate]) == 6
    assert exit_code_of([Stop("failed", 1, "tool"), unavailable]) == 1  # a failed stage over one that could not run
    assert exit_code_of([Stop(UNAVAILABLE, 0, "not in this version")]) == 0
