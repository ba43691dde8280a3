"""``serving.lora: auto``: the planner decides, per LoRA fine-tune, the shared LoRA engine or a merged engine.

The decision itself is :func:`pipeline.fleet.lora_decision.decide` (the objective, the solver and
its proof of optimality are documented there). This module gathers its inputs from the planned
variants of one base (a "LoRA family": the base variant and the fine-tunes that differ from it only
by ``model.adapter``), every auto fine-tune first planned as merged:

* **shared option**: the adapter's memory per GPU of the shared engine (one slot of the LoRA cache the
  group will get, the cache capped at one batch's adapters: :func:`_cache`) and its predicted speedup there
  (:func:`pipeline.costmodel.lora.shared_speedup`: plain decoding plus the LoRA GEMMs and the mixing of
  ``min(fine-tunes, concurrency)`` adapters in a step; where the target speculates on a LoRA engine, the
  engine's method with the LoRA parts on every row, at the fine-tune's measured acceptance when its
  rehearsal ran). The planner calls :func:`decide_family` once per method the shared engine could run
  (on the PyTorch backend: EAGLE-3 with the base's drafter, NGram, plain) and keeps the best fleet
  (:func:`best_shared_engine`);
* **merged option**: the merged variant's method, its predicted speedup at the fleet's concurrency on
  the spec's GPU (:func:`pipeline.costmodel.predict.predict`) at an acceptance length measured by the
  variant's rehearsal when one ran, else the median of the published results for that method
  (its method's ``prior_acceptance``, said in the reason), and its per-GPU memory estimate. With
  ``speculative.method: auto`` every method the merged engine could run on its target
  (:func:`merged_methods`: the heads it has or will train, and the methods needing none) is priced
  and the best predicted speedup taken (ties: auto's order), the reason listing them; an explicit
  method is priced alone. A fine-tune the decision shares, or merges with another method than the
  one whose heads it asked to train, has that ``heads.<method>.train`` dropped
  (:func:`as_decided`), and its reason says so with the numbers;
* the GPUs: each one's usable memory (less the placement's reserve) less what the spec's other
  engines need, placed by the placement's rule (:func:`pipeline.fleet.assign.assign_gpus`);
* the concurrency: ``evaluation.batch_sizes[0]`` of the base variant, else :data:`DEFAULT_CONCURRENCY`;
* the traffic: each fine-tune's ``traffic.share``.

A base with an explicit ``speculative.method`` (not ``auto`` or ``none``) cannot become the LoRA
engine, which decodes plainly: its auto fine-tunes are merged, and the rule says how to let them
share. A bfloat16 base on GPUs cannot share its engine (:data:`pipeline.lora.rules.BFLOAT16_REFUSAL`): its
auto fine-tunes are merged. Without a GPU to weigh (``target: reference`` on the CPU, or no
``gpu.type``) there is no memory constraint and no GPU speedup to compare: an auto fine-tune whose
plan runs Medusa or EAGLE heads keeps an engine of its own (the LoRA engine cannot run them), every
other one shares its base's engine (one copy of the weights), and the reason says why.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline import methods, targets
from pipeline.costmodel.hardware import gpu_perf
from pipeline.costmodel.lora import LoraLoad, shared_speedup
from pipeline.costmodel.predict import predict
from pipeline.costmodel.profile import DEFAULT_RUNTIME, calibration
from pipeline.costmodel.step import Deployment
from pipeline.errors import InputError
from pipeline.fleet.assign import Engine, assign_gpus
from pipeline.fleet.lora_decision import (
    FineTune,
    LoraDecisionError,
    LoraFleet,
    MergedOption,
    SharedEngine,
    VariantChoice,
    decide,
)
from pipeline.geometry import ModelGeometry
from pipeline.lora.group import base_key, hf_modules
from pipeline.lora.memory import LoraCacheSize, cache_size
from pipeline.lora.rules import BFLOAT16_REFUSAL, HF_TO_TRTLLM, speculative_refusal
from pipeline.lora.types import AutoDecision
from pipeline.plan.adapters import AdapterConfig, check_adapter_folder
from pipeline.plan.memory import BYTES_PER_ELEMENT, GIB, RESERVE_FRACTION
from pipeline.plan.types import VariantPlan
from pipeline.spec.document import Spec, VariantSpec

# A merged fine-tune whose acceptance no rehearsal has measured is priced at its method's
# prior_acceptance (pipeline/methods/): the median mean acceptance length of the fitted published
# results (bench/published_speedups.csv: EAGLE 27 rows, 3.39-6.62; Medusa 10 rows, 2.31-2.44; Lookahead
# 12 rows, 1.61-1.69). A fine-tune's own acceptance can be far lower (stale heads): `evaluate` measures
# it, and the decision then uses the measurement.
DEFAULT_CONCURRENCY = 1  # evaluation.batch_sizes[0] when the spec has no evaluation section


def families(variants: Sequence[VariantSpec]) -> list[tuple[VariantSpec, list[VariantSpec]]]:
    """(base variant, its LoRA fine-tunes) for every base with at least one ``serving.lora: auto`` fine-tune."""
    out = []
    for base in (v for v in variants if not v.model.adapters):
        key = base_key(base)
        tunes = [v for v in variants if len(v.model.adapters) == 1 and base_key(v) == key]
        if any(v.serving.lora == "auto" for v in tunes):
            out.append((base, tunes))
    return out


def decide_family(
    spec: Spec,
    base: VariantSpec,
    tunes: list[VariantSpec],
    plans: dict[str, VariantPlan],
    others: Sequence[VariantPlan],
    engine: VariantPlan,
    merged_plans: dict[str, list[VariantPlan]] | None = None,
) -> AutoDecision:
    """The choice for each fine-tune of ``base`` (``plans``: every variant planned, auto ones as merged;
    ``others``: the planned variants outside this family, whose engines take GPU memory first; ``engine``:
    the base planned as the shared engine, decoding plainly; ``merged_plans``: a fine-tune's merged plans,
    one per method its merged engine could run, where it has more than its plan's). InputError (one
    line) when even the leanest choice does not fit."""
    base_plan = plans[base.name]
    gpu = base_plan.gpu
    if not targets.definition(base_plan.target).lora_on_bfloat16 and base.model.dtype == "bfloat16":
        rule = f"every auto fine-tune merged: {BFLOAT16_REFUSAL}"
        why = "TensorRT-LLM 1.2.1 serves no adapters to a bfloat16 engine"
        choices = [_fixed(t, plans, "", merged_only=why) for t in tunes]
        return AutoDecision(base.name, tuple(choices), None, rule)
    method = base.speculative.method
    if method != "auto" and speculative_refusal(method, base_plan.target):  # the group's engine is the base's
        rule = (
            f"every auto fine-tune merged: the base runs speculative.method {method}, and the LoRA engine it "
            "would become runs no speculative method; set the base's speculative.method to auto or none to "
            "let fine-tunes share its engine"
        )
        choices = [
            _fixed(t, plans, "", merged_only=f"the base's engine runs {method}, a LoRA engine none") for t in tunes
        ]
        return AutoDecision(base.name, tuple(choices), None, rule)
    engine_method = engine.speculative.method
    if not targets.on_gpus(base_plan.target) or gpu is None:
        where = "no gpu.type" if targets.on_gpus(base_plan.target) else "the CPU reference target"
        rule = f"{where}: no GPU memory or GPU speedup to weigh; auto fine-tunes without heads share the base's engine"
        choices = [_fixed(t, plans, where) for t in tunes]
        return AutoDecision(base.name, tuple(choices), None, rule, engine_method)
    concurrency = base.evaluation.batch_sizes[0] if base.evaluation else DEFAULT_CONCURRENCY
    arch, tp = base_plan.arch, base_plan.tp
    dtype_bytes = BYTES_PER_ELEMENT[base.model.dtype]
    deployment = _deployment(base_plan)
    loads = {t.name: _load(spec, t, arch.num_layers, base_plan.weights_present) for t in tunes}
    candidates = [loads[t.name] for t in tunes if t.serving.lora != "merged"]
    mixed = min(len(candidates), concurrency) or 1
    cache = _cache(candidates, arch, dtype_bytes, base_plan.build.max_batch_size, tp)
    slot_gib = cache.max_adapter_bytes / GIB if cache else 0.0
    fine_tunes, notes, priced = [], {}, {}
    for t in tunes:
        load = loads[t.name]
        merged = None
        if t.serving.lora != "shared":
            merged, notes[t.name], priced[t.name] = _merged(
                (merged_plans or {}).get(t.name, [plans[t.name]]), concurrency
            )
        fine_tunes.append(
            FineTune(
                t.name,
                slot_gib,
                _shared_speedup(
                    engine, deployment, LoraLoad(load.rank, load.modules, mixed), concurrency, plans[t.name]
                ),
                merged,
                t.traffic.share,
                t.serving.lora,
            )
        )
    count = base_plan.gpu_count or 1
    usable = gpu.memory_gib * (1 - RESERVE_FRACTION)
    free = _free_after(others, count, usable)
    cap = cache.gpu_gib if cache else 0.0
    shared = SharedEngine(tuple(range(base_plan.world_size)), engine.memory.total_gib, True, cap, engine_method)
    try:
        decision = decide(LoraFleet(fine_tunes, shared, tuple(free), concurrency))
    except LoraDecisionError as exc:
        raise InputError(f"{spec.file}: LoRA fine-tunes of base {base.name}: {exc}") from None
    rule = (
        f"maximize the fleet's predicted speedup 1 / sum(share / speedup) on {count} x {gpu.name} "
        f"({DEFAULT_RUNTIME} profile)"
    )
    by_name = {t.name: t for t in tunes}
    noted = []
    for c in decision.choices:
        reason = f"{c.reason}; {notes[c.name]}" if c.name in notes else c.reason
        for key, unused in _dropped_training(by_name[c.name], c):
            if c.choice == "shared":
                why = f"the fine-tune is shared, and the LoRA engine runs none of its own {unused} heads"
            else:
                speedup = priced[c.name][unused]
                why = f"merged {c.method} {c.speedup:.2f}x beats {unused} {speedup:.2f}x with trained heads"
            reason += f"; heads.{key}.train dropped (no train-heads stage): {why}"
        noted.append(replace(c, reason=reason))
    return AutoDecision(base.name, tuple(noted), decision, rule, engine_method)


def best_shared_engine(weighed: Sequence[AutoDecision]) -> AutoDecision:
    """Of one family's decisions, one per method its shared engine could run (auto's order), the one with
    the best fleet speedup (ties: the first), recording every engine's; the first without a GPU to weigh."""
    solved = [d.decision for d in weighed]
    if len(weighed) == 1 or None in solved:
        return weighed[0]
    speedups = [(str(d.shared_method), s.fleet_speedup) for d, s in zip(weighed, solved) if s is not None]
    best = max(range(len(weighed)), key=lambda i: speedups[i][1])
    return replace(weighed[best], shared_compared=tuple(speedups))


def merged_methods(variant: VariantSpec) -> list[str]:
    """The methods a merged engine of ``variant`` could run on its target, in ``method: auto``'s order:
    those whose heads it has (``heads.<key>.path``) or will train (``heads.<key>.train``), and those
    needing none."""
    return [
        d.name
        for d in methods.definitions()
        if d.auto_reason is not None
        and variant.target in d.targets
        and (d.heads is None or getattr(variant.heads, d.heads.key) is not None)
    ]


def merged_variant(variant: VariantSpec, method: str) -> VariantSpec:
    """``variant`` (``speculative.method: auto``) merged with ``method``: the heads of every other method
    dropped (their training too), ``auto`` kept where it then picks ``method``."""
    keep = methods.definition(method).heads
    drop = {
        d.heads.key: None for d in methods.with_heads() if d.heads is not None and d.heads.key != (keep and keep.key)
    }
    out = variant.model_copy(update={"heads": variant.heads.model_copy(update=drop)})
    if merged_methods(out)[:1] != [method]:
        out = out.model_copy(update={"speculative": out.speculative.model_copy(update={"method": method})})
    return out


def as_decided(variant: VariantSpec, choice: VariantChoice, planned: str) -> VariantSpec:
    """The fine-tune as ``choice`` serves it (``planned``: the method it was planned with, merged):
    shared (``serving.lora: shared``), an auto one without its heads' training, whose heads the LoRA
    engine does not run; merged with another method than planned, that method's heads only
    (:func:`merged_variant`)."""
    if choice.choice == "merged":
        return variant if choice.method == planned else merged_variant(variant, choice.method)
    drop = {}
    for key, _ in _dropped_training(variant, choice):
        heads = getattr(variant.heads, key)
        drop[key] = None if heads.path is None else heads.model_copy(update={"train": None})
    heads = variant.heads.model_copy(update=drop)
    serving = variant.serving.model_copy(update={"lora": "shared"})
    return variant.model_copy(update={"heads": heads, "serving": serving})


def _dropped_training(variant: VariantSpec, choice: VariantChoice) -> list[tuple[str, str]]:
    """(heads key, method) of each ``heads.<key>.train`` an auto fine-tune asked for and ``choice`` leaves
    unused: every one on the shared engine, the other methods' on a merged one (an explicit serving.lora
    keeps the planner's refusal)."""
    if variant.serving.lora != "auto":
        return []
    runs = choice.method if choice.choice == "merged" else None
    keys = [(d.heads.key, d.name) for d in methods.with_heads() if d.heads is not None and d.name != runs]
    return [(k, m) for k, m in keys if getattr(variant.heads, k) is not None and getattr(variant.heads, k).train]


def _fixed(t: VariantSpec, plans: dict[str, VariantPlan], where: str, merged_only: str = "") -> VariantChoice:
    """The choice without a GPU to weigh; ``merged_only``: why sharing is impossible (auto means merged)."""
    if t.serving.lora == "merged":
        choice, reason = "merged", "merged (serving.lora: merged)"
    elif t.serving.lora == "shared":
        choice, reason = "shared", "shared (serving.lora: shared)"
    elif merged_only:
        choice, reason = "merged", f"merged: {merged_only}"
    elif methods.definition(plans[t.name].speculative.method).heads is not None:
        heads = plans[t.name].speculative.method
        choice, reason = "merged", f"merged: {where}, and its {heads} heads need an engine of their own"
    else:
        choice, reason = "shared", f"shared: {where}, one copy of the weights serves every fine-tune"
    method = "lora" if choice == "shared" else plans[t.name].speculative.method
    return VariantChoice(t.name, choice, method, (), {}, math.nan, math.nan, reason)  # type: ignore[arg-type]


def _deployment(plan: VariantPlan) -> Deployment:
    assert plan.gpu is not None  # weighed only with a gpu.type
    return Deployment(
        plan.arch,
        gpu_perf(plan.gpu.name),
        "fp8" if plan.quant.weights_fp8 else "bfloat16",
        "fp8" if plan.quant.kv_cache_fp8 else "bfloat16",
        plan.tp,
        plan.pp,
        profile=calibration(DEFAULT_RUNTIME).profile,
    )


@dataclass(frozen=True)
class _Load:
    rank: int
    modules: tuple[str, ...]  # PEFT's projection names


def _cache(
    candidates: Sequence[_Load], arch: ModelGeometry, dtype_bytes: int, max_batch_size: int, tp: int
) -> LoraCacheSize | None:
    """The LoRA cache the group would get if every fine-tune that may share did
    (:func:`pipeline.lora.memory.cache_size`: ``min(adapters, max_batch_size)`` slots of the largest rank
    on the union of the target modules). Each shared fine-tune is charged one slot, up to that cache:
    for whichever set S shares, min(|S| slots, the cap) is never less than the cache S's group gets
    (min(|S|, max_batch_size) slots of S's own largest), and equal to it when the adapters share a
    rank and modules."""
    if not candidates:
        return None
    modules = sorted({HF_TO_TRTLLM[m] for c in candidates for m in c.modules})
    return cache_size(arch, [c.rank for c in candidates], modules, dtype_bytes, max_batch_size, tp)


def _load(spec: Spec, variant: VariantSpec, num_layers: int, weights_present: bool) -> _Load:
    config: AdapterConfig = check_adapter_folder(
        spec.resolve_path(variant.model.adapters[0]), require_weights=weights_present
    )
    order = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    modules = tuple(m for m in order if m in hf_modules(config, num_layers))
    return _Load(max([config.r, *config.rank_pattern.values()]), modules)


def _shared_speedup(
    engine: VariantPlan, deployment: Deployment, load: LoraLoad, concurrency: int, merged: VariantPlan
) -> float:
    """A fine-tune's predicted speedup on the shared engine: plain decoding plus its LoRA parts, or, where
    the target speculates on a LoRA engine, the engine's method with the LoRA parts on every row it feeds
    (one shared draft: the adapters change the target only), at the acceptance the fine-tune's own
    rehearsal measured for that method (``merged``: its merged plan, whose evaluate stage ran its
    merged weights, which is the adapted target), else the method's published median."""
    method = engine.speculative.method
    if not methods.is_speculative(method):
        return shared_speedup(deployment, load, concurrency)
    drafting = engine.speculative.drafting()
    measured = _measured_acceptance(merged) if merged.speculative.method == method else None
    acceptance = measured if measured is not None else methods.definition(method).prior_acceptance
    acceptance = min(max(acceptance, 1.0), drafting.rows)
    return predict(deployment, drafting, acceptance, [concurrency], lora=load)[0].speedup


def _measured_acceptance(plan: VariantPlan) -> float | None:
    """The chosen candidate's mean acceptance length from the variant's rehearsal, when one ran."""
    stage = next((s for s in plan.stages if s.name == "evaluate"), None)
    if stage is None:
        return None
    try:
        report = json.loads((Path(stage.output) / "evaluation.json").read_text())
    except (OSError, ValueError):
        return None
    method, chosen = plan.speculative.method, (report.get("choice") or {}).get("candidate")
    records = [r for r in report.get("candidates", []) if isinstance(r, dict) and r.get("method") == method]
    records.sort(key=lambda r: r.get("name") != chosen)  # the rehearsal's choice first
    values = [r.get("mean_acceptance_length") for r in records]
    found = [float(v) for v in values if isinstance(v, (int, float)) and v >= 1]
    return found[0] if found else None


def _merged(options: Sequence[VariantPlan], concurrency: int) -> tuple[MergedOption, str, dict[str, float]]:
    """The best predicted of ``options`` (one plan per method the merged engine could run, in auto's
    order: the first wins a tie), its note, and every option's speedup by method."""
    priced = [_merged_one(p, concurrency) for p in options]
    best, note = max(priced, key=lambda o: o[0].speedup)
    if len(priced) > 1:
        compared = ", ".join(f"{o.method} {o.speedup:.2f}x" for o, _ in priced)
        note = f"{note}; merged methods compared: {compared} (the best taken)"
    return best, note, {o.method: o.speedup for o, _ in priced}


def _merged_one(plan: VariantPlan, concurrency: int) -> tuple[MergedOption, str]:
    method = plan.speculative.method
    drafting = plan.speculative.drafting()
    measured = _measured_acceptance(plan)
    acceptance = measured if measured is not None else methods.definition(method).prior_acceptance
    acceptance = min(max(acceptance, 1.0), drafting.rows)
    speedup = predict(_deployment(plan), drafting, acceptance, [concurrency])[0].speedup
    if not methods.is_speculative(method):
        note = "merged decodes plainly (no heads, no Lookahead)"
    elif measured is not None:
        note = f"{method} acceptance length {acceptance:.2f}, measured by its rehearsal"
    else:
        note = f"{method} acceptance length {acceptance:.2f} assumed (published median)"
    return MergedOption(method, speedup, plan.memory.total_gib, plan.world_size), note


def _free_after(others: Sequence[VariantPlan], count: int, usable: float) -> list[float]:
    """Each GPU's memory left after the other engines, placed as the fleet placement places them
    (:func:`pipeline.fleet.assign.assign_gpus`)."""
    engines = []
    for p in others:
        if targets.on_gpus(p.target):
            ids = p.serving.gpu_device_ids
            engines.append(Engine(p.name, p.world_size, p.memory.total_gib, None if ids is None else tuple(ids)))
    _, load = assign_gpus(engines, count)
    return [max(usable - used, 0.0) for used in load]
