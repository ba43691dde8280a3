"""What one run of ``specdeploy engine`` or ``evaluate`` did, in the one shape every CI output is made from.

A :class:`RunRecord` holds, per variant, each stage's state in this run (with its seconds and, for a
stage that stopped, why) and where the variant's evaluation is. ``--json`` prints
:meth:`RunRecord.to_json`, ``--junit-xml`` writes :func:`pipeline.release.ci.junit.write_junit` of it, and
``GITHUB_STEP_SUMMARY`` gets :func:`pipeline.release.ci.summary.step_summary` of it.

Stage states: ``ran``, ``skipped`` (up to date: the fingerprint matched), ``gate failed`` (an evaluate
stage that ran and whose choice failed a release gate), ``unavailable`` (it cannot run on this host:
exit 3), ``failed`` (a tool's error), ``not run`` (an earlier stage stopped the variant).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.evaluation.result import GATE_FAILED, manifest_entry, read_result

RAN, SKIPPED, UNAVAILABLE, FAILED, NOT_RUN = "ran", "skipped", "unavailable", "failed", "not run"
# The states after which the variant's evaluation on disk is this run's (or was found up to date by it).
EVALUATED = (RAN, SKIPPED, GATE_FAILED)
CHARTS = ("acceptance.png", "speedup_vs_batch.png")


@dataclass(frozen=True)
class StageRecord:
    stage: str
    state: str  # ran | skipped | gate failed | unavailable | failed | not run
    seconds: float | None = None
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "state": self.state, "seconds": self.seconds, "message": self.message or None}


@dataclass(frozen=True)
class VariantRecord:
    name: str
    method: str  # the plan's method (none | medusa | eagle | lookahead)
    stages: tuple[StageRecord, ...]
    exit_code: int = 0
    evaluation_dir: Path | None = None  # the evaluate stage's output, when the variant has one

    @property
    def evaluated(self) -> bool:
        """Whether this run evaluated the variant (or found its evaluation up to date)."""
        return self.evaluation_dir is not None and any(
            s.stage == "evaluate" and s.state in EVALUATED for s in self.stages
        )

    def evaluation(self) -> dict | None:
        """The variant's evaluation.json, when this run evaluated it."""
        return read_result(self.evaluation_dir) if self.evaluated and self.evaluation_dir is not None else None

    def report_files(self) -> list[Path]:
        """report.md and the charts the evaluate stage wrote, those that are there."""
        if not self.evaluated or self.evaluation_dir is None:
            return []
        names = ("report.md", *CHARTS)
        return [self.evaluation_dir / n for n in names if (self.evaluation_dir / n).is_file()]

    def stopped(self) -> StageRecord | None:
        """The stage that stopped the variant (None: every stage ran or was up to date)."""
        return next((s for s in self.stages if s.state in (GATE_FAILED, UNAVAILABLE, FAILED)), None)

    def to_json(self) -> dict[str, Any]:
        stopped = self.stopped()
        evaluation = manifest_entry(self.evaluation_dir) if self.evaluated and self.evaluation_dir else None
        if evaluation is not None:
            evaluation["reports"] = [str(p) for p in self.report_files()]
        return {
            "name": self.name,
            "method": self.method,
            "exit_code": self.exit_code,
            "stopped_at": stopped.stage if stopped else None,
            "stages": [s.to_json() for s in self.stages],
            "evaluation": evaluation,
        }


@dataclass(frozen=True)
class RunRecord:
    command: str  # engine | evaluate
    spec: str  # the spec's name
    spec_file: str
    variants: tuple[VariantRecord, ...]
    exit_code: int
    manifest: Path | None = None  # engine: the release manifest
    repository: Path | None = None  # engine: the whole-spec Triton repository, when written

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "command": self.command,
            "spec": self.spec,
            "spec_file": self.spec_file,
            "exit_code": self.exit_code,
            "variants": [v.to_json() for v in self.variants],
        }
        if self.command == "engine":
            body["manifest"] = str(self.manifest) if self.manifest else None
            body["repository"] = str(self.repository) if self.repository else None
        return body


def variant_record(
    variant: Any,
    done: Iterable[StageRecord],
    *,
    stopped_by: StageRecord | None = None,
    exit_code: int = 0,
    last: str | None = None,
) -> VariantRecord:
    """A variant's record from the stages a run finished (``done``, in order) and the one that stopped it:
    every later stage of the plan, up to ``last`` (default: all of them), is ``not run``.
    ``variant``: its VariantPlan."""
    records: dict[str, StageRecord] = {}
    for record in done:
        records[record.stage] = record
    if stopped_by is not None:
        previous = records.get(stopped_by.stage)
        seconds = stopped_by.seconds if stopped_by.seconds is not None else (previous.seconds if previous else None)
        records[stopped_by.stage] = StageRecord(stopped_by.stage, stopped_by.state, seconds, stopped_by.message)
    why = f"{stopped_by.stage} stopped the variant" if stopped_by is not None else "not run"
    planned = [stage.name for stage in variant.stages]
    if last is not None and last in planned:
        planned = planned[: planned.index(last) + 1]
    ordered = [records.pop(stage) if stage in records else StageRecord(stage, NOT_RUN, None, why) for stage in planned]
    names = {stage.name for stage in variant.stages}
    evaluate_dir = variant.stage("evaluate").output if "evaluate" in names else None
    return VariantRecord(variant.name, variant.method, tuple(ordered + list(records.values())), exit_code, evaluate_dir)


def shown_path(path: Path, base: Path | None = None) -> str:
    """``path`` relative to ``base`` (default: the current folder) when it is inside, else as given."""
    base = Path(os.getcwd()) if base is None else base
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)
