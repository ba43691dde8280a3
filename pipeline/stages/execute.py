"""Runs a plan: prepares the embedded model if needed, then each variant's stages in order.

Stage bodies live in one module each (``pipeline.stages.<name>``) exposing
``run(variant: VariantPlan, stage: StagePlan, out: Path) -> None``, listed in ``STAGE_BODIES``;
they read everything they need from the plan and write only into ``out`` (a temp folder the
runner renames).
A body that cannot run on this host raises ``StageUnavailable``: the variant's later
stages are skipped and the reason is reported.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import StageUnavailable
from pipeline.fleet.placement import sharing_problem
from pipeline.io.hashing import HashCache
from pipeline.plan.types import Plan, StagePlan, VariantPlan
from pipeline.stages import build, checkpoint, convert, evaluate, lora, merge, package, quantize, train_heads
from pipeline.stages.owners import claim_outputs
from pipeline.stages.runner import StageResult, run_stage

StageBody = Callable[[VariantPlan, StagePlan, Path], None]

STAGE_BODIES: dict[str, StageBody] = {
    "merge": merge.run,
    "lora": lora.run,
    "train-heads": train_heads.run,
    "quantize": quantize.run,
    "checkpoint": checkpoint.run,
    "convert": convert.run,
    "evaluate": evaluate.run,
    "build": build.run,
    "package": package.run,
}

__all__ = [
    "STAGE_BODIES",
    "StageUnavailable",
    "VariantOutcome",
    "execute_plan",
    "execute_spec_repository",
    "stage_body",
]


@dataclass(frozen=True)
class VariantOutcome:
    variant: str
    results: tuple[StageResult, ...]
    stopped_at: str | None = None
    reason: str | None = None
    exit_code: int = 0

    def joined(self, later: VariantOutcome) -> VariantOutcome:
        """This run's stages followed by a later run's (the rest of the variant's stages)."""
        return dataclasses.replace(later, results=self.results + later.results)


def stage_body(name: str) -> StageBody:
    return STAGE_BODIES[name]


def execute_plan(
    plan: Plan,
    *,
    only: set[str] | None = None,
    force: bool = False,
    say: Callable[[str], None] = print,
    hashes: HashCache | None = None,
) -> list[VariantOutcome]:
    claim_outputs(plan, only)  # another spec's folders are refused before anything is written
    outcomes = []
    for variant in plan.variants:
        if only and variant.name not in only:
            continue
        outcomes.append(_execute_variant(variant, force=force, say=say, hashes=hashes))
    return outcomes


def _execute_variant(
    variant: VariantPlan, *, force: bool, say: Callable[[str], None], hashes: HashCache | None = None
) -> VariantOutcome:
    if variant.builtin and variant.model_dir is not None:
        from pipeline.embedded import prepare_embedded_model

        say(f"[{variant.name}] embedded model {variant.builtin}: preparing {variant.model_dir}")
        prepare_embedded_model(variant.model_dir.parent)
    results: list[StageResult] = []
    produced: set[Path] = set()
    for stage in variant.stages:
        say(f"[{variant.name}] {stage.name} -> {stage.output}")
        body = stage_body(stage.name)
        try:
            require_inputs(variant, stage, produced)
            result = run_stage(stage, functools.partial(body, variant, stage), force=force, on_wait=say, hashes=hashes)
        except StageUnavailable as exc:
            say(f"[{variant.name}] {stage.name}: {exc}")
            return VariantOutcome(variant.name, tuple(results), stage.name, str(exc), exc.exit_code)
        say(
            f"[{variant.name}] {stage.name}: {'up to date, skipped' if result.status == 'skipped' else 'done'}"
            f" ({result.seconds:.1f} s)"
        )
        results.append(result)
        produced.add(stage.output)
        if stage.name == "evaluate":
            from pipeline.evaluation.result import RELEASE_EXIT_CODE, release_failure

            failed = release_failure(result.output)
            if failed:  # release.on_fail: fail; the later stages do not run for this variant
                say(f"[{variant.name}] release gate failed: {failed}")
                return VariantOutcome(variant.name, tuple(results), stage.name, failed, RELEASE_EXIT_CODE)
    return VariantOutcome(variant.name, tuple(results))


def execute_spec_repository(
    plan: Plan,
    packaged: set[str],
    *,
    force: bool = False,
    say: Callable[[str], None] = print,
    hashes: HashCache | None = None,
) -> StageResult | None:
    """The whole-spec repository (``plan.repository``) once every variant of the spec is packaged
    in this run (``packaged``: their names); None, said why, when there is none or a variant is missing."""
    if plan.repository is None:
        return None
    missing = [variant.name for variant in plan.variants if variant.name not in packaged]
    if missing:
        say(
            f"[{plan.spec_name}] whole-spec repository {plan.repository.output} not written: "
            f"{', '.join(missing)} not packaged in this run"
        )
        return None
    problem = sharing_problem(plan)
    if problem is not None:  # each variant still has its own repository and server
        lines = problem.splitlines()
        say(f"[{plan.spec_name}] whole-spec repository not written: " + "; ".join(lines))
        return None
    stage = plan.repository
    say(f"[{plan.spec_name}] {stage.name} (all variants) -> {stage.output}")
    result = run_stage(stage, functools.partial(package.run_spec, plan), force=force, on_wait=say, hashes=hashes)
    say(
        f"[{plan.spec_name}] {stage.name}: {'up to date, skipped' if result.status == 'skipped' else 'done'}"
        f" ({result.seconds:.1f} s)"
    )
    return result


# What each stage input is, for the line that says what to do when it is not on this host.
_INPUT_HINTS = {
    "model": ("model weights", "put the Hugging Face checkpoint there (model.path)"),
    "tokenizer": ("tokenizer files", "put the Hugging Face checkpoint there (model.path)"),
    "heads": ("speculative heads", "put the heads there (heads.<method>.path)"),
    "init": ("heads to warm-start from", "put the base's heads there (heads.<method>.path) or use train.init: random"),
    "data": ("heads training text", "fix heads.<method>.train.data in the spec"),
    "checkpoint": ("converted checkpoint files", "run the convert stage first (specdeploy engine SPEC)"),
    "engine": ("engine files", "run the build stage first (specdeploy engine SPEC)"),
    "prompts0": ("evaluation prompts", "fix evaluation.prompts in the spec"),
}


def require_inputs(variant: VariantPlan, stage: StagePlan, produced: set[Path]) -> None:
    """StageUnavailable (exit 3) when an input the spec points at, not an earlier stage's
    output, is absent: a plan made from a preset runs until the weights are needed."""
    for name, path in stage.inputs.items():
        if path in produced or path.exists():
            continue
        what, fix = _INPUT_HINTS.get(name, (f"{name} files", "provide them"))
        where = str(path)
        if variant.model_dir is None and name in ("model", "tokenizer"):
            where, fix = "no model.path in the spec", "give model.path, a Hugging Face checkpoint folder"
        raise StageUnavailable(
            f"the {what} are not on this host ({where}): {fix}, or run on a host that has "
            f"them; plan/validate work without them"
        )
