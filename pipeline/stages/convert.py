"""The convert stage (body lands with its issue; until then it says so)."""

from __future__ import annotations

from pathlib import Path

from pipeline.plan import StagePlan, VariantPlan
from pipeline.stages.execute import StageUnavailable


def run(variant: VariantPlan, stage: StagePlan, out: Path) -> None:
    raise StageUnavailable("not implemented yet in this version of specdeploy", exit_code=0)
