"""``speculative.method: best``: the measured choice becomes what is built and packaged.

The evaluate stage measures the *candidates*: every method the variant's heads can serve, from one
checkpoint with those heads (the plan's ``rehearsal`` config). Its result names the chosen
candidate and records, per candidate, the settings a build of it needs (:func:`candidate_build`).
The plan of a ``best`` variant reads that result (:func:`measured_config`) and plans the convert,
build and package stages for the chosen method: a Lookahead or plain choice converts the base model
without the heads, a Medusa or EAGLE choice keeps them with the chosen tree (EAGLE-2: the dynamic
tree). The evaluate stage itself never depends on the choice (it converts the candidates' checkpoint
in its own scratch folder), so re-planning after it is stable; ``specdeploy engine`` runs the
stages up to evaluate first, re-plans, then runs the rest (:func:`split_at_evaluate`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipeline import methods
from pipeline.plan.speculative import SpeculativeConfig

EVALUATE = "evaluate"


def candidate_build(candidate: Any) -> dict[str, Any]:
    """What a build of this candidate (pipeline.evaluation.candidates.Candidate) sets, as JSON: every
    method's keys (null but the candidate's own method's, which its definition's ``recorded`` fills)."""
    settings = candidate.settings
    build: dict[str, Any] = {"method": candidate.method}
    build |= {key: None for d in methods.definitions() for key in d.recorded_keys}
    build["dynamic_tree"] = bool(settings.eagle_dynamic_tree)
    build["dynamic_tree_max_top_k"] = settings.eagle_dynamic_tree_max_top_k if settings.eagle_dynamic_tree else None
    definition = methods.definition(candidate.method)
    if definition.recorded is not None:
        build |= definition.recorded(candidate)
    return build


def config_of(build: dict[str, Any], candidates: SpeculativeConfig, reason: str) -> SpeculativeConfig | None:
    """The plan's speculative config of a candidate recorded by :func:`candidate_build` (None: it cannot be
    made from these candidates, e.g. a result recorded for other heads)."""
    name = build.get("method")
    method = next((d for d in methods.definitions() if d.name == name), None)
    if method is None:
        return None
    if method.measured is None:
        return SpeculativeConfig.of(method.name, reason)
    config = method.measured(build, candidates.config if candidates.method == method.name else None)
    return None if config is None else SpeculativeConfig.of(method.name, reason, config)


def measured_config(folder: Path, candidates: SpeculativeConfig) -> tuple[SpeculativeConfig | None, str]:
    """The chosen candidate's config from the evaluation in ``folder`` and a line for the plan's notes;
    (None, why) when there is no usable evaluation there yet."""
    from pipeline.evaluation.result import read_result

    result = read_result(folder)
    if result is None:
        return None, (
            "best: no evaluation yet, so this plan shows the candidates' build; `specdeploy engine` runs the "
            "evaluate stage first and builds the measured choice"
        )
    choice = result.get("choice") or {}
    record = next((c for c in result.get("candidates", []) if c.get("name") == choice.get("candidate")), None)
    reason = f"best: measured choice {choice.get('candidate')}: {choice.get('reason')}"
    config = config_of(record.get("build") or {}, candidates, reason) if record else None
    if config is None:
        return None, (
            f"best: {folder} does not record how to build {choice.get('candidate')} from these heads; "
            "run `specdeploy evaluate SPEC --force`"
        )
    return config, f"{reason} (from {folder / 'evaluation.json'})"


def split_at_evaluate(plan: Any, only: set[str]) -> tuple[Any | None, Any]:
    """(the stages up to evaluate of the variants that choose by measurement, or None when none does;
    a function giving, from the plan made again after them, the stages still to run)."""
    first = [
        dataclasses.replace(v, stages=v.stages[: [s.name for s in v.stages].index(EVALUATE) + 1])
        for v in plan.variants
        if v.rehearsal is not None and (not only or v.name in only)
    ]
    names = {v.name for v in first}

    def rest(replanned: Any) -> Any:
        variants = tuple(
            dataclasses.replace(v, stages=v.stages[[s.name for s in v.stages].index(EVALUATE) + 1 :])
            if v.name in names
            else v
            for v in replanned.variants
        )
        return dataclasses.replace(replanned, variants=variants)

    return (dataclasses.replace(plan, variants=tuple(first)) if first else None), rest
