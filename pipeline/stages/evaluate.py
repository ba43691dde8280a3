"""The evaluate stage: every candidate method measured on the variant's prompts (pipeline/evaluation/)."""

from __future__ import annotations

from pathlib import Path

from pipeline.plan.types import StagePlan, VariantPlan


def run(variant: VariantPlan, stage: StagePlan, out: Path) -> None:
    from pipeline.evaluation.stage import run_evaluation

    run_evaluation(variant, stage, out, say=lambda text: print(text, flush=True))
