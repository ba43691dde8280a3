"""Spec -> Plan: the method per variant, the derived TensorRT-LLM 1.2 build config, the stages.

The plan is the single source of every derived number (max_draft_len, engine max_seq_len,
lookahead W/N/G, tp, pp): stages read them from here and never recompute them. All
TensorRT-LLM 1.2.1 rules are checked here, before any GPU time is spent; every problem
names the spec line that caused it, and all problems are reported at once.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from pipeline import methods, targets
from pipeline.errors import HostFilesystemError, InputError
from pipeline.geometry import ModelGeometry
from pipeline.lora import auto as lora_auto
from pipeline.lora.group import check_shared_variant, plan_groups
from pipeline.lora.rules import speculative_refusal
from pipeline.lora.types import AutoDecision, LoraGroupPlan
from pipeline.methods.base import tp_problem
from pipeline.plan import adapters, head_training, resources
from pipeline.plan.memory import MemoryEstimate, estimate_memory
from pipeline.plan.speculative import SpeculativeConfig

# The pre/postprocessing model.py sources copied into every repository: a change re-packages.
from pipeline.plan.types import (
    TRITON_PYTHON_MODELS,
    BuildConfig,
    OutputRoots,
    Plan,
    QuantPlan,
    StagePlan,
    VariantPlan,
    jsonable,
)
from pipeline.quantize.calibration import DEFAULT_CALIBRATION
from pipeline.quantize.checks import is_modelopt_fp8_checkpoint
from pipeline.spec import gpus, presets
from pipeline.spec.document import INT32_MAX, Spec, VariantSpec
from pipeline.spec.yaml_source import KeyPath


class _Problems:
    """Collects located problems for one variant."""

    def __init__(self, spec: Spec, variant: str) -> None:
        self.spec, self.variant = spec, variant
        self.errors: list[str] = []
        self.notes: list[str] = []

    def error(self, path: KeyPath, message: str) -> None:
        position, shown = self.spec.locate(self.variant, path)
        self.errors.append(f"{position} {shown}: {message} [variant {self.variant}]")

    def note(self, message: str) -> None:
        self.notes.append(message)


def _plan_variants(spec: Spec, variants: list[VariantSpec], roots: OutputRoots) -> tuple[list[VariantPlan], list[str]]:
    plans, errors = [], []
    for variant in variants:
        problems = _Problems(spec, variant.name)
        plan = _plan_variant(spec, variant, roots, problems)
        errors.extend(problems.errors)
        if plan is not None:
            plans.append(plan)
    return plans, errors


def _decide_lora(
    spec: Spec, variants: list[VariantSpec], plans: list[VariantPlan], roots: OutputRoots
) -> tuple[list[AutoDecision], list[VariantSpec]]:
    """serving.lora auto: the planner's choice per fine-tune (pipeline/lora/auto.py), every auto fine-tune
    planned as merged first (with method auto, once more per other method its merged engine could run);
    the variants to plan as decided (:func:`pipeline.lora.auto.as_decided`: the ones it shares set to
    serving.lora shared, the training of heads left unused dropped; a base whose shared engine is best
    with another method than auto's pick set to that method). The shared engine is weighed as the base
    with each method its target runs on a LoRA engine (:func:`_shared_engines`: plain decoding on the
    engine flow; EAGLE-3 with the base's drafter, NGram or plain on the PyTorch backend) and the decision
    with the best fleet speedup taken."""
    by_name = {p.name: p for p in plans}
    decisions = []
    decided: dict[str, VariantSpec] = {}
    for base, tunes in lora_auto.families(variants):
        if base.name not in by_name or any(t.name not in by_name for t in tunes):
            continue  # reported: the plan fails anyway
        family = {base.name, *(t.name for t in tunes)}
        shared = {n for n, v in decided.items() if v.serving.lora == "shared"}
        others = [p for p in by_name.values() if p.name not in family and p.name not in shared]
        candidates = {t.name: _merged_candidates(spec, t, by_name[t.name], roots) for t in tunes}
        weighed, refused = [], []
        for engine in _shared_engines(spec, base, by_name[base.name], roots):
            try:
                weighed.append(lora_auto.decide_family(spec, base, tunes, by_name, others, engine, candidates))
            except InputError as exc:  # nothing fits beside this engine; another may
                refused.append(exc)
        if not weighed:
            raise refused[0]
        decision = lora_auto.best_shared_engine(weighed)
        decisions.append(decision)
        chosen = decision.shared_method
        if decision.shared_compared and chosen is not None and chosen != by_name[base.name].speculative.method:
            decided[base.name] = lora_auto.merged_variant(base, chosen)
        choices = {c.name: c for c in decision.choices}
        for t in tunes:
            c = choices[t.name]
            after = lora_auto.as_decided(t, c, by_name[t.name].speculative.method)
            if after is not t:
                decided[t.name] = after
                if c.choice == "merged":  # later families weigh the engine as merged
                    by_name[t.name] = next(p for p in candidates[t.name] if p.speculative.method == c.method)
    return decisions, [decided.get(v.name, v) for v in variants]


def _shared_engines(spec: Spec, base: VariantSpec, plan: VariantPlan, roots: OutputRoots) -> list[VariantPlan]:
    """The base planned as the shared LoRA engine, once per method it could run there, in auto's order:
    with an explicit method, its plan alone (a refused one is said by the decision); with method auto,
    every method of :func:`pipeline.lora.auto.merged_methods` the target runs on a LoRA engine, then
    plain decoding (those that plan without a problem)."""
    if base.speculative.method != "auto":
        return [plan]
    names = [m for m in lora_auto.merged_methods(base) if not speculative_refusal(m, plan.target)]
    engines = []
    for method in dict.fromkeys([*names, methods.PLAIN]):
        if method == plan.speculative.method:
            engines.append(plan)
            continue
        problems = _Problems(spec, base.name)
        engine = _plan_variant(spec, lora_auto.merged_variant(base, method), roots, problems)
        if engine is not None and not problems.errors:
            engines.append(engine)
    return engines or [plan]


def _merged_candidates(spec: Spec, variant: VariantSpec, plan: VariantPlan, roots: OutputRoots) -> list[VariantPlan]:
    """An auto fine-tune with method auto planned merged with every method its engine could run (``plan``
    for auto's own pick), those that plan without a problem; else ``plan`` alone."""
    if variant.serving.lora != "auto" or variant.speculative.method != "auto":
        return [plan]
    found = []
    for method in lora_auto.merged_methods(variant):
        problems = _Problems(spec, variant.name)
        merged = (
            plan
            if method == plan.speculative.method
            else _plan_variant(spec, lora_auto.merged_variant(variant, method), roots, problems)
        )
        if merged is not None and not problems.errors:
            found.append(merged)
    return found or [plan]


def variant_with_method(variant: VariantSpec, method: str) -> VariantSpec:
    return variant.model_copy(update={"speculative": variant.speculative.model_copy(update={"method": method})})


class PlanErrors(InputError):
    """The spec's problems (one per line), with the variants that did plan: their input files can still be
    read for problems of their own (:func:`pipeline.plan.preflight.checked_plan`), so that every problem
    is said at once."""

    def __init__(self, message: str, planned: tuple[VariantPlan, ...]):
        super().__init__(message)
        self.planned = planned


def make_plan(spec: Spec, roots: OutputRoots) -> Plan:
    """Spec -> Plan, in three steps:

    1. every variant as its spec writes it: its problems, and what the LoRA decision prices;
    2. the LoRA decision (``serving.lora: auto``: which fine-tunes share an engine, and its method), made
       from those plans and the alternatives it prices (:func:`_decide_lora`), skipped while step 1 found
       problems;
    3. the variants the decision changes, and each LoRA group's engine, planned as decided, each once
       (:func:`_as_decided`).

    Every problem of every step is said at once (:class:`PlanErrors`)."""
    variants = list(spec.variants)
    written, errors = _plan_variants(spec, variants, roots)
    decisions, decided = ([], variants) if errors else _decide_lora(spec, variants, written, roots)
    if len(variants) > 1:
        errors.extend(_spec_repository_problems(spec, roots))
    plans, groups, problems = _as_decided(spec, roots, written, decided)
    errors.extend(problems)
    if errors:
        raise PlanErrors("\n".join(errors), tuple(plans))
    reasons = {c.name: f"serving.lora auto: {c.reason}" for d in decisions for c in d.choices}
    reasons |= {d.base: _shared_engine_note(d, spec, decided) for d in decisions if d.shared_compared}
    reasons |= _client_adapter_notes(plans, groups)
    plans = [dataclasses.replace(p, notes=(*p.notes, reasons[p.name])) if p.name in reasons else p for p in plans]
    repository = _spec_repository(spec, roots, plans)
    return Plan(spec.file, spec.name, tuple(plans), repository, tuple(groups), tuple(decisions))


def _as_decided(
    spec: Spec, roots: OutputRoots, written: list[VariantPlan], decided: list[VariantSpec]
) -> tuple[list[VariantPlan], list[LoraGroupPlan], list[str]]:
    """Step 3 of :func:`make_plan`: the plans as the LoRA decision left the variants (``decided``, in spec
    order; ``written``: step 1's plans), the LoRA groups and the problems. The fine-tunes the decision
    changed are planned first, since a group is made of its members' plans (their geometry, adapters and
    memory); then each group's base as the group's engine (the LoRA plugin, the adapters, the LoRA cache),
    its members served by that engine (:func:`_shared_member`), and every other variant the decision
    changed; the rest keep step 1's plans."""
    changed = {after.name for before, after in zip(spec.variants, decided) if after is not before}
    by_name = {p.name: p for p in written}
    fine_tunes, errors = _plan_variants(spec, [v for v in decided if v.name in changed and v.model.adapters], roots)
    by_name |= {p.name: p for p in fine_tunes}
    group_problems: dict[str, _Problems] = {}
    groups = plan_groups(
        spec,
        [by_name[v.name] for v in decided if v.name in by_name],
        lambda name: group_problems.setdefault(name, _Problems(spec, name)),
        decided,
    )
    errors.extend(e for p in group_problems.values() for e in p.errors)
    engines = {g.base_variant: g for g in groups}
    for variant in decided:
        group = engines.get(variant.name)
        if group is None and (variant.name not in changed or variant.model.adapters):
            continue  # step 1's plan stands, or planned above
        problems = _Problems(spec, variant.name)
        replanned = _plan_variant(spec, variant, roots, problems, group)
        errors.extend(problems.errors)
        if replanned is None:
            continue
        by_name[variant.name] = replanned
        if group is not None:
            for member in group.members:
                by_name[member.variant] = _shared_member(by_name[member.variant], replanned, member.task_id, roots)
    return [by_name[v.name] for v in decided if v.name in by_name], groups, errors


def _client_adapter_notes(plans: list[VariantPlan], groups: list[LoraGroupPlan]) -> dict[str, str]:
    """A note for each variant whose ``serving.lora_client_adapters: true`` opens no server to clients'
    adapters: only a LoRA group's base sets it for the group's server (a shared fine-tune's models set
    its own task id; a variant without a group has no LoRA engine)."""
    settings = {p.name: p.serving.lora_client_adapters for p in plans}
    member_of = {m.variant: g for g in groups for m in g.members}
    bases = {g.base_variant for g in groups}
    notes = {}
    for name, on in settings.items():
        group = member_of.get(name)
        if not on or name in bases or (group is not None and settings.get(group.base_variant or "", True)):
            continue
        where = (
            f"its LoRA group's server is variant {group.base_variant}'s: set it there"
            if group is not None
            else "no LoRA engine serves this variant (it opens a serving.lora: shared group's server, set on "
            "the group's base)"
        )
        notes[name] = f"serving.lora_client_adapters: true does nothing here: {where}"
    return notes


def _shared_engine_note(decision: AutoDecision, spec: Spec, decided: list[VariantSpec]) -> str:
    """The base's note: what its shared engine runs, against what else it could, and the training of
    heads that choice leaves unused."""
    note = f"serving.lora auto: the shared engine runs {decision.shared_engine_text()}"
    before = next(v for v in spec.variants if v.name == decision.base).heads
    after = next(v for v in decided if v.name == decision.base).heads
    for d in methods.with_heads():
        assert d.heads is not None  # with_heads() lists the methods that have them
        key = d.heads.key
        was, now = getattr(before, key), getattr(after, key)
        if was is not None and was.train and now is None:
            note += f"; heads.{key}.train dropped (no train-heads stage): {d.name} is not the shared engine's method"
    return note


def _shared_member(member: VariantPlan, engine: VariantPlan, task_id: int, roots: OutputRoots) -> VariantPlan:
    """A shared LoRA fine-tune served by its group's engine: the engine's stages (the same outputs and
    fingerprints, so they run once) and a package stage of its own whose models set its task id."""
    package = engine.stage("package")
    own = StagePlan(
        "package",
        roots.triton_repo / member.name,
        dict(package.inputs),
        package.params | {"lora_task_id": task_id},
        package.resources,
    )
    stages = tuple(s for s in engine.stages if s.name != "package") + (own,)
    keep = ("name", "notes", "serving")
    return dataclasses.replace(
        engine, stages=stages, **{k: getattr(member, k) for k in keep}, rehearsal=None, rehearsal_build=None
    )


# Model names of the whole-spec repository that a variant's ensemble (named after it) must not take.
RESERVED_MODEL_NAMES = ("preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls")


def _spec_repository_problems(spec: Spec, roots: OutputRoots) -> list[str]:
    """triton_repo/<spec>/ sits beside triton_repo/<variant>/, and holds a model per variant name."""
    errors = []
    for variant in spec.variants:
        problems = _Problems(spec, variant.name)
        if variant.deploy != spec.variants[0].deploy:  # one Deployment serves the whole-spec repository
            problems.error(
                ("deploy",),
                f"differs from variant {spec.variants[0].name}'s; a spec deploys to one namespace and volume "
                "claim: set deploy: once, at the top of the spec",
            )
        name = variant.name.casefold()  # folders that differ only by case are one on macOS and Windows
        if name == spec.name.casefold():
            problems.error(
                ("name",),
                f"a variant named like the spec collides with the spec's repository {roots.triton_repo / spec.name}; "
                "rename the variant or the spec",
            )
        elif name in RESERVED_MODEL_NAMES or name.endswith(tuple(f"-{reserved}" for reserved in RESERVED_MODEL_NAMES)):
            problems.error(
                ("name",),
                f"'{variant.name}' is a model name of the spec's repository ({', '.join(RESERVED_MODEL_NAMES)}, "
                "<variant>-tensorrt_llm, ...); rename the variant",
            )
        errors.extend(problems.errors)
    return errors


def _spec_repository(spec: Spec, roots: OutputRoots, variants: list[VariantPlan]) -> StagePlan | None:
    """One Triton repository serving every variant; None for one variant, or for a target without engines
    (the LLM API serves a LoRA group's fine-tunes from its engine's server, named in its serve.json)."""
    if len(variants) < 2 or not all(targets.definition(v.target).builds_engines for v in variants):
        return None
    params: dict[str, Any] = {}
    for variant in variants:
        package = variant.stage("package")
        gpu = variant.gpu.name if variant.gpu else None
        params[variant.name] = package.params | {"gpu": gpu, "gpu_count": variant.gpu_count}
    return StagePlan(
        "package",
        roots.triton_repo / spec.name,
        {variant.name: variant.stage("package").output for variant in variants} | {"models": TRITON_PYTHON_MODELS},
        params,
    )


def _plan_variant(
    spec: Spec, variant: VariantSpec, roots: OutputRoots, problems: _Problems, lora: LoraGroupPlan | None = None
) -> VariantPlan | None:
    """``lora``: this variant's engine serves that LoRA group (built with the LoRA plugin, its
    adapters converted by a lora stage, its LoRA cache in the memory estimate)."""
    requested = variant.speculative.method
    variant = check_shared_variant(spec, variant, problems)
    target = targets.definition(variant.target)
    if lora is not None and variant.speculative.method == "auto" and not target.lora_speculative_methods:
        problems.note(f"the engine of LoRA group {lora.name}: speculative.method auto resolves to none")
        variant = variant_with_method(variant, methods.PLAIN)
    arch, model_dir, weights_present = _resolve_model(spec, variant, roots, problems)
    if arch is None:
        return None
    trained_dir = _inside(roots.engines, variant.name, problems) / "heads"  # a train-heads stage's output
    speculative, heads_dir = _choose_method(spec, variant, arch, problems, trained_dir)
    if speculative is None:
        return None
    if requested == "auto" and variant.speculative.method == methods.PLAIN:  # a LoRA engine's rule, not the spec's
        reason = "auto: none on a LoRA engine (TensorRT-LLM 1.2.1 combines the LoRA plugin with no speculative mode)"
        speculative = dataclasses.replace(speculative, reason=reason)
    training = head_training.plan_training(spec, variant, speculative.method, trained_dir.parent, problems)
    if training is not None:  # convert and evaluate read the trained heads
        heads_dir = training.output
    rehearsal, rehearsal_heads = None, heads_dir
    if variant.speculative.method == "best":  # the measured choice, when an evaluation recorded one
        from pipeline.evaluation.apply import measured_config

        rehearsal = speculative
        chosen, note = measured_config(roots.engines / variant.name / "evaluation", rehearsal)
        problems.note(note)
        if chosen is not None:
            speculative = chosen
            heads_dir = heads_dir if methods.definition(chosen.method).heads is not None else None
    tp, pp = variant.parallel.tp, variant.parallel.pp
    _check_parallelism(variant, arch, speculative, problems)
    if pp > 1 and methods.is_speculative(speculative.method) and not target.pipeline_parallel_speculation:
        problems.error(
            ("parallel", "pp"),
            f"{speculative.method} with pp {pp}: {target.title} runs no speculative decoding under pipeline "
            "parallelism (docs/source/features/feature-combination-matrix.md: No); use tp instead, or "
            "speculative.method: none",
        )
    gpu = gpus.gpu_type(variant.gpu.type) if variant.gpu else None
    quant = _quant_plan(spec, variant, model_dir, weights_present, speculative, gpu, problems)
    build = _build_config(variant, arch, speculative, quant, gpu, problems)
    if lora is not None:
        refusal = speculative_refusal(speculative.method, variant.target)
        if refusal is not None:
            problems.error(
                ("speculative", "method"), f"{speculative.method} on LoRA group {lora.name}'s engine: {refusal}"
            )
        # The group sets these (max_lora_rank from extra_flags was already taken as the group's maximum).
        flags = {k: v for k, v in build.extra_flags.items() if k.lstrip("-") not in ("max_lora_rank", "lora_plugin")}
        build = dataclasses.replace(build, lora=lora.build(variant.model.dtype), extra_flags=flags)
    memory = estimate_memory(
        arch,
        tp=tp,
        pp=pp,
        weight_dtype="fp8" if quant.weights_fp8 else variant.model.dtype,
        kv_dtype="fp8" if quant.kv_cache_fp8 else variant.model.dtype,
        activation_dtype=variant.model.dtype,
        speculative=speculative,
        max_batch_size=build.max_batch_size,
        engine_max_seq_len=build.engine_max_seq_len,
        max_num_tokens=build.engine_max_num_tokens,
        gpu_gib=gpu.memory_gib if gpu else None,
    )
    if lora is not None:  # the LoRA cache's GPU part comes on top of the engine
        memory = dataclasses.replace(memory, overhead_gib=memory.overhead_gib + lora.cache.gpu_gib)
    largest = max(gpus.GPU_TYPES.values(), key=lambda g: g.memory_mib)
    on_gpus = targets.on_gpus(variant.target)
    if on_gpus and memory.fits is False and gpu is not None:
        problems.error(
            ("build", "max_batch_size"),
            f"does not fit on {gpu.name} ({gpu.memory_gib:.0f} GiB): {memory.describe()}; "
            "lower max_batch_size or max_seq_len, raise tp, or use FP8",
        )
    elif memory.total_gib > largest.memory_gib:  # the reference backend serves what ships to GPUs
        problems.error(
            ("build", "max_batch_size"),
            f"does not fit on any GPU ({largest.name} has {largest.memory_gib:.0f} GiB): "
            f"{memory.describe()}; lower max_batch_size, max_seq_len or the draft length, or raise tp",
        )
    elif on_gpus and gpu is None:
        problems.note("no gpu.type given: FP8 support and the memory estimate were not checked")
    _check_int32(build, problems)
    merge = adapters.plan_merge(spec, variant, roots.engines, model_dir, problems, weights_present)
    stages = _stages(variant, roots, model_dir, heads_dir, speculative, quant, build, problems, merge, training, lora)
    rehearsal_build = None
    if rehearsal is not None:
        rehearsal_build = _build_config(variant, arch, rehearsal, quant, gpu, _Problems(spec, variant.name))
    calibration = _calibration(spec, variant, problems)
    if variant.evaluation is not None:
        stages = _with_evaluate(
            spec,
            variant,
            stages,
            model_dir,
            heads_dir,
            gpu,
            rehearsal,
            rehearsal_heads,
            calibration,
            speculative,
            quant.kv_cache_fp8,
        )
    stages, serve_resources = _resources(variant, arch, speculative, quant, memory, gpu, stages, problems)
    return VariantPlan(
        name=variant.name,
        target=variant.target,
        arch=arch,
        model_dir=model_dir,
        builtin=variant.model.builtin,
        weights_present=weights_present,
        heads_dir=heads_dir,
        speculative=speculative,
        tp=tp,
        pp=pp,
        gpu=gpu,
        gpu_count=variant.gpu.count if variant.gpu else None,
        quant=quant,
        build=build,
        serving=variant.serving,
        memory=memory,
        stages=stages,
        notes=tuple(problems.notes),
        serve_resources=serve_resources,
        rehearsal=rehearsal,
        rehearsal_build=rehearsal_build,
        deploy=variant.deploy,
    )


def _resources(
    variant: VariantSpec,
    arch: ModelGeometry,
    speculative: SpeculativeConfig,
    quant: QuantPlan,
    memory: MemoryEstimate,
    gpu: gpus.GpuType | None,
    stages: tuple[StagePlan, ...],
    problems: _Problems,
) -> tuple[tuple[StagePlan, ...], resources.StageResources]:
    """Each stage's machine needs; on the spec's GPUs, a stage that cannot fit is an error."""
    on_gpus = gpu if targets.on_gpus(variant.target) else None
    sizing = resources.Sizing(
        arch=arch,
        dtype=variant.model.dtype,
        speculative=speculative,
        memory=memory,
        tp=variant.parallel.tp,
        world_size=variant.parallel.tp * variant.parallel.pp,
        target=variant.target,
        gpu=on_gpus,
        gpu_count=variant.gpu.count if variant.gpu else None,
        calibration_max_seq_len=quant.calibration_max_seq_len,
        offload=quant.offload,
        build_workers=variant.build.workers,
    )
    stages = tuple(
        dataclasses.replace(stage, resources=resources.stage_resources(stage.name, sizing)) for stage in stages
    )
    if on_gpus is not None and variant.gpu is not None:
        where = {"quantize": ("quantization", "weights"), "build": ("gpu", "type")}
        for stage in stages:
            problem = resources.gpu_shortfall(stage.resources, on_gpus, variant.gpu.count) if stage.resources else None
            if problem and stage.name in where:
                fix = (
                    "raise gpu.count or use larger GPUs, or set quantization.offload: cpu or disk (slow)"
                    if stage.name == "quantize"
                    else "raise tp or use larger GPUs"
                )
                problems.error(
                    where[stage.name],
                    f"the {stage.name} stage does not fit {variant.gpu.count} x {on_gpus.name}: {problem}; {fix}",
                )
    return stages, resources.serve_resources(sizing).rounded()


def _resolve_model(
    spec: Spec, variant: VariantSpec, roots: OutputRoots, problems: _Problems
) -> tuple[ModelGeometry | None, Path | None, bool]:
    model = variant.model
    if model.builtin:
        cached = roots.cache / model.builtin
        present = (cached / "config.json").exists()
        arch = presets.geometry_from_hf_config(cached / "config.json") if present else presets.preset(model.builtin)
        return arch, cached, present
    folder = spec.resolve_path(model.path) if model.path else None
    if folder is not None and (folder / "config.json").exists():
        try:
            arch = presets.geometry_from_hf_config(folder / "config.json")
        except InputError as exc:
            problems.error(("model", "path"), str(exc))
            return None, folder, True
        if model.preset and presets.preset(model.preset).hidden_size != arch.hidden_size:
            problems.note(f"model.preset '{model.preset}' differs from {folder}/config.json; the weights win")
        return arch, folder, True
    if model.preset:
        if folder is not None:
            problems.note(
                f"weights not found at {folder}: planned from preset '{model.preset}'; "
                "quantize/convert need the weights"
            )
        return presets.preset(model.preset), folder, False
    problems.error(
        ("model", "path"),
        f"{folder}: no config.json there; give a Hugging Face checkpoint folder, "
        "or add model.preset to plan without weights",
    )
    return None, folder, False


def _choose_method(
    spec: Spec, variant: VariantSpec, arch: ModelGeometry, problems: _Problems, trained_dir: Path
) -> tuple[SpeculativeConfig | None, Path | None]:
    """auto: the first method in :data:`pipeline.methods.DEFINITIONS`' order whose heads are present
    (EAGLE, then Medusa) or that needs none (Lookahead); else the spec's method, resolved by its rules."""
    requested = variant.speculative.method
    heads = variant.heads
    if requested not in ("auto", "best", *methods.names()):  # the spec takes any name (it sits below the methods)
        known = ", ".join(repr(name) for name in ("auto", "best", *methods.names()))
        problems.error(("speculative", "method"), f"must be one of {known} (got {requested!r})")
        return None, None
    if requested == "best" and variant.evaluation is None:
        problems.error(
            ("speculative", "method"),
            "best chooses by measurement and needs an evaluation: section "
            "(e.g. evaluation: {count: 32}); or use method: auto",
        )
        return None, None
    if requested in ("auto", "best"):
        chosen = next(
            d
            for d in methods.definitions()
            if d.auto_reason is not None
            and variant.target in d.targets
            and (d.heads is None or getattr(heads, d.heads.key) is not None)
        )
        reason = chosen.auto_reason or ""
        if requested == "best":  # the build follows the heads; the evaluate stage measures and chooses
            reason = f"best: candidates built from the heads ({reason.split(': ', 1)[1]}); evaluate chooses"
    else:
        chosen, reason = methods.definition(requested), f"method: {requested} set in the spec"
    method = chosen.name
    if variant.target not in chosen.targets:
        problems.error(("speculative", "method"), methods.target_refusal(chosen, variant.target))
        return None, None
    heads_dir = None
    if chosen.heads is not None:
        key = chosen.heads.key
        head_spec = getattr(heads, key)
        if head_spec is None:
            problems.error(
                ("speculative", "method"),
                f"{key} needs heads.{key}.path; add the heads or use method: lookahead (no extra weights)",
            )
            return None, None
        heads_dir = spec.resolve_path(head_spec.path) if head_spec.path else trained_dir
    if chosen.resolve is None:
        return SpeculativeConfig.of(method, reason), heads_dir
    config = chosen.resolve(variant, arch, heads_dir, problems)
    if config is None:
        return None, heads_dir
    return SpeculativeConfig.of(method, reason, config), heads_dir


def _check_parallelism(
    variant: VariantSpec, arch: ModelGeometry, speculative: SpeculativeConfig, problems: _Problems
) -> None:
    tp, pp = variant.parallel.tp, variant.parallel.pp
    legal = [t for t in range(1, arch.num_heads + 1) if tp_problem(arch, t) is None]
    problem = tp_problem(arch, tp)
    if problem:
        problems.error(("parallel", "tp"), f"{problem}; legal tp for this model: {legal}")
    if pp > arch.num_layers:
        problems.error(("parallel", "pp"), f"pp {pp} exceeds the {arch.num_layers} layers")
    heads = methods.definition(speculative.method).heads
    if heads is not None and heads.splits_on_hidden and arch.hidden_size % tp:
        # The convert stage's refusal (pipeline/checkpoint/layout.py): the heads' linears split on hidden_size.
        problems.error(
            ("parallel", "tp"),
            f"tp {tp} does not divide hidden_size {arch.hidden_size}, which the {speculative.method} heads' "
            f"linears are split on; legal tp for this model: {[t for t in legal if arch.hidden_size % t == 0]}",
        )
    if variant.gpu is not None:
        world = tp * pp
        if variant.gpu.count < world:
            problems.error(("gpu", "count"), f"{variant.gpu.count} GPUs cannot hold world size tp*pp = {world}")
    device_ids = variant.serving.gpu_device_ids
    if device_ids is not None and len(device_ids) != tp * pp:
        problems.error(
            ("serving", "gpu_device_ids"),
            f"lists {len(device_ids)} GPUs; the engine needs tp*pp = {tp * pp}, one per rank",
        )
    ports = [variant.serving.grpc_port, variant.serving.http_port, variant.serving.metrics_port]
    if len(set(ports)) != 3:
        problems.error(("serving",), f"grpc_port, http_port and metrics_port must differ (got {ports})")
    limit = variant.serving.http_max_request_bytes
    most = targets.definition(variant.target).http_body_limit
    if most is not None and variant.serving.http and limit > most:
        problems.error(
            ("serving", "http_max_request_bytes"),
            f"{limit} bytes: the {variant.target} target's tritonserver 2.51 is reported to crash on HTTP bodies "
            f"of ~4 MB (triton-inference-server/server#5840); at most {most}",
        )


def _quant_plan(
    spec: Spec,
    variant: VariantSpec,
    model_dir: Path | None,
    weights_present: bool,
    speculative: SpeculativeConfig,
    gpu: gpus.GpuType | None,
    problems: _Problems,
) -> QuantPlan:
    q = variant.quantization
    prequantized = bool(weights_present and model_dir and is_modelopt_fp8_checkpoint(model_dir))
    if prequantized and q.weights != "fp8":
        problems.note(f"{model_dir} is a ModelOpt FP8 checkpoint: building FP8 (quantize stage skipped)")
    weights_fp8 = q.weights == "fp8" or prequantized
    if weights_fp8 and targets.on_gpus(variant.target) and gpu is not None and not gpu.supports_fp8:
        major, minor = gpu.compute_capability
        problems.error(
            ("quantization", "weights"),
            f"FP8 needs compute capability >= 8.9 (Ada, Hopper, Blackwell); {gpu.name} is {major}.{minor}",
        )
    calibration = spec.resolve_path(q.calibration.data) if q.calibration.data else DEFAULT_CALIBRATION
    if weights_fp8 and not prequantized and q.calibration.data and not calibration.is_file():
        problems.error(("quantization", "calibration", "data"), f"{calibration}: calibration file not found")
    return QuantPlan(
        weights_fp8,
        q.kv_cache == "fp8",
        prequantized,
        q.quantize_heads,
        calibration,
        q.calibration.size,
        q.calibration.max_seq_len,
        q.offload,
    )


def _build_config(
    variant: VariantSpec,
    arch: ModelGeometry,
    speculative: SpeculativeConfig,
    quant: QuantPlan,
    gpu: gpus.GpuType | None,
    problems: _Problems,
) -> BuildConfig:
    b = variant.build
    if b.max_input_len >= b.max_seq_len:
        problems.error(
            ("build", "max_input_len"),
            f"{b.max_input_len} leaves no room to generate within max_seq_len {b.max_seq_len}",
        )
    factor = (arch.rope_scaling or {}).get("factor", 1.0)
    if (arch.rope_scaling or {}).get("rope_type") in ("llama3", "su", "longrope"):
        factor = 1.0  # trtllm-build's own rule: these types already count in max_position_embeddings
    if b.max_seq_len > arch.max_position_embeddings * factor:
        problems.note(
            f"max_seq_len {b.max_seq_len} exceeds the model's {int(arch.max_position_embeddings * factor)} "
            "positions; quality beyond them is not guaranteed"
        )
    if b.max_beam_width > 1 and speculative.build_mode:
        problems.error(
            ("build", "max_beam_width"),
            f"{b.max_beam_width} with speculative.method {speculative.method}: TensorRT-LLM serves speculative "
            "decoding with beam width 1 only; use 1, or method none for beam search",
        )
    draft = speculative.max_draft_len
    eagle_layers = speculative.eagle.num_eagle_layers if speculative.eagle else 0
    # KV room for a step's draft tokens: trtllm-build's (draft + EAGLE layers); on a runtime without an
    # engine build (the LLM API), every row a step verifies beyond the one it decodes (a tree's nodes).
    room = draft + eagle_layers if speculative.build_mode else speculative.drafting().rows - 1
    # trtllm-build (builder.py check_max_num_tokens): cap at batch*seq, floor at one KV block,
    # then make room for every draft token of a full batch.
    tokens_per_block = BuildConfig.tokens_per_block
    engine_tokens = max(min(b.max_num_tokens, b.max_batch_size * b.max_seq_len), tokens_per_block)
    if speculative.build_mode:
        engine_tokens = max(engine_tokens, b.max_batch_size * (draft + 1))
    # With paged context FMHA always on, trtllm-build ends up enabling FP8 context FMHA exactly
    # when the KV cache is FP8 too (and the GPU has FP8 tensor cores).
    fp8_fmha = quant.weights_fp8 and quant.kv_cache_fp8 and (gpu is None or gpu.supports_fp8)
    # The FP8 GEMM plugin wins at small batch (latency); at large batch TensorRT's own kernels do.
    gemm_plugin = "fp8" if quant.weights_fp8 and b.max_batch_size <= 16 else "auto"
    return BuildConfig(
        dtype=variant.model.dtype,
        max_batch_size=b.max_batch_size,
        max_input_len=b.max_input_len,
        max_seq_len=b.max_seq_len,
        max_num_tokens=b.max_num_tokens,
        max_draft_len=draft,
        speculative_decoding_mode=speculative.build_mode,
        engine_max_seq_len=b.max_seq_len + room,
        engine_max_num_tokens=engine_tokens,
        use_fp8_context_fmha=fp8_fmha,
        gemm_plugin=gemm_plugin,
        max_beam_width=b.max_beam_width,
        extra_flags=dict(b.extra_flags),
        workers=_workers(variant, problems),
    )


def _check_int32(build: BuildConfig, problems: _Problems) -> None:
    """Derived sizes TensorRT-LLM keeps in SizeType32 (int32) must not overflow."""
    derived = {
        ("build", "max_seq_len"): ("the engine's max_seq_len (max_seq_len + draft tokens)", build.engine_max_seq_len),
        ("build", "max_num_tokens"): (
            "the engine's max_num_tokens (max_batch_size x (draft tokens + 1))",
            build.engine_max_num_tokens,
        ),
        ("build", "max_batch_size"): (
            "max_batch_size x the engine's max_seq_len (KV-cache tokens)",
            build.max_batch_size * build.engine_max_seq_len,
        ),
    }
    for path, (what, value) in derived.items():
        if value > INT32_MAX:
            problems.error(path, f"{what} is {value}, more than TensorRT-LLM's int32 sizes hold ({INT32_MAX})")


def _workers(variant: VariantSpec, problems: _Problems) -> int | None:
    world_size = variant.parallel.tp * variant.parallel.pp
    if variant.build.workers is not None and variant.build.workers > world_size:
        problems.error(
            ("build", "workers"),
            f"{variant.build.workers} is more than the {world_size} rank(s) "
            "(tp x pp) there are to build; give at most that many",
        )
    return variant.build.workers


def _stages(
    variant: VariantSpec,
    roots: OutputRoots,
    model_dir: Path | None,
    heads_dir: Path | None,
    speculative: SpeculativeConfig,
    quant: QuantPlan,
    build: BuildConfig,
    problems: _Problems,
    merge: adapters.MergeTarget | None = None,
    training: head_training.HeadsTraining | None = None,
    lora: LoraGroupPlan | None = None,
) -> tuple[StagePlan, ...]:
    variant_root = _inside(roots.engines, variant.name, problems)
    stages: list[StagePlan] = []
    source = model_dir if model_dir is not None else Path("<weights missing>")
    if merge is not None:  # base + LoRA adapters -> merged HF checkpoint; quantize/convert read it
        merge_inputs = {"model": source} | {f"adapter{i}": folder for i, folder in enumerate(merge.adapters)}
        stages.append(StagePlan("merge", merge.output, merge_inputs, {"adapters": [str(a) for a in merge.adapters]}))
        source = merge.output
    if training is not None:  # the heads learn the variant's own target, before any quantization
        stages.append(StagePlan("train-heads", training.output, {"model": source} | training.inputs, training.params))
    if quant.weights_fp8 and not quant.prequantized:
        quantized = variant_root / "quantized"
        stages.append(
            StagePlan(
                "quantize",
                quantized,
                {"model": source, "calibration": quant.calibration_data},
                {
                    "kv_cache_fp8": quant.kv_cache_fp8,
                    "calibration_size": quant.calibration_size,
                    "calibration_max_seq_len": quant.calibration_max_seq_len,
                    "dtype": variant.model.dtype,
                },
            )
        )
        source = quantized
    if not targets.definition(variant.target).builds_engines:
        return (
            *stages,
            *_llm_api_stages(
                variant, roots, variant_root, source, model_dir, heads_dir, speculative, build, problems, lora
            ),
        )
    checkpoint = variant_root / "checkpoint"
    convert_inputs = {"model": source} | ({"heads": heads_dir} if heads_dir else {})
    stages.append(
        StagePlan(
            "convert",
            checkpoint,
            convert_inputs,
            {
                "tp": variant.parallel.tp,
                "pp": variant.parallel.pp,
                "dtype": variant.model.dtype,
                "speculative": jsonable(speculative.to_dict()),
                "kv_cache_fp8": quant.kv_cache_fp8,
            },
        )
    )
    engine = variant_root / "engine"
    stages.append(
        StagePlan(
            "build",
            engine,
            {"checkpoint": checkpoint},
            {"target": variant.target, "build": jsonable(dataclasses.asdict(build))},
        )
    )
    tokenizer = model_dir if model_dir is not None else Path("<weights missing>")
    package_inputs = {"engine": engine, "tokenizer": tokenizer, "models": TRITON_PYTHON_MODELS}
    lora_params: dict[str, Any] = {}
    if lora is not None:  # the group's adapters in the runtime's format, one folder per task id
        adapters_dir = variant_root / "lora"
        tasks = {str(m.task_id): m.adapter for m in lora.members}
        base = {"model": model_dir if model_dir is not None else Path("<weights missing>")}
        stages.append(StagePlan("lora", adapters_dir, base | tasks, {"dtype": variant.model.dtype}))
        package_inputs["lora"] = adapters_dir
        # Where the deployment mounts them, as gpt_model_path (pipeline/triton/backend_params.py).
        lora_params = {"lora": lora.triton_parameters(variant.deploy.engines_root / variant_root.name / "lora")}
    stages.append(
        StagePlan(
            "package",
            _inside(roots.triton_repo, variant.name, problems),
            package_inputs,
            {
                "serving": variant.serving.model_dump(),
                # The engines' path in the deployment (gpt_model_path); the rest of deploy: is not packaged.
                "engines_root": str(variant.deploy.engines_root),
                "target": variant.target,
                "speculative": jsonable(speculative.to_dict()),
                "build": jsonable(dataclasses.asdict(build)),
            }
            | lora_params,
        )
    )
    return tuple(stages)


def _llm_api_stages(
    variant: VariantSpec,
    roots: OutputRoots,
    variant_root: Path,
    source: Path,
    model_dir: Path | None,
    heads_dir: Path | None,
    speculative: SpeculativeConfig,
    build: BuildConfig,
    problems: _Problems,
    lora: LoraGroupPlan | None,
) -> tuple[StagePlan, ...]:
    """A target whose runtime loads the Hugging Face checkpoint (TensorRT-LLM's LLM API): the checkpoint it
    loads (merged or FP8-quantized when the spec says so) with its EAGLE-3 drafter, the LoRA group's
    adapters as PEFT folders, and the runtime configuration (pipeline/llm_api/); no convert, no engine
    build."""
    tokenizer = model_dir if model_dir is not None else Path("<weights missing>")
    checkpoint = variant_root / "checkpoint"
    inputs = {"model": source, "tokenizer": tokenizer} | ({"drafter": heads_dir} if heads_dir else {})
    stages = [StagePlan("checkpoint", checkpoint, inputs, {"dtype": variant.model.dtype})]
    package_inputs = {"checkpoint": checkpoint}
    lora_params: dict[str, Any] = {}
    if lora is not None:  # PEFT folders, one per task id, which the LLM API's LoRARequest loads by path
        adapters_dir = variant_root / "lora"
        tasks = {str(m.task_id): m.adapter for m in lora.members}
        stages.append(StagePlan("lora", adapters_dir, {"model": tokenizer} | tasks, {"format": "peft"}))
        package_inputs["lora"] = adapters_dir
        lora_params = {
            "lora": {
                "max_lora_rank": lora.max_lora_rank,
                # the GPU cache's adapters (one batch's worth, pipeline/lora/memory.py); the host holds all
                "max_loras": max(1, lora.cache.gpu_bytes // max(lora.cache.max_adapter_bytes, 1)),
                "max_cpu_loras": len(lora.members),
                "target_modules": list(lora.target_modules),
                "members": {m.variant: m.task_id for m in lora.members},
            }
        }
    stages.append(
        StagePlan(
            "package",
            _inside(roots.triton_repo, variant.name, problems),
            package_inputs,
            {
                "target": variant.target,
                "serving": variant.serving.model_dump(),
                "engines_root": str(variant.deploy.engines_root),
                "parallel": {"tp": variant.parallel.tp, "pp": variant.parallel.pp},
                "speculative": jsonable(speculative.to_dict()),
                "build": jsonable(dataclasses.asdict(build)),
            }
            | lora_params,
        )
    )
    return tuple(stages)


def _calibration(spec: Spec, variant: VariantSpec, problems: _Problems) -> Path | None:
    """gpu.calibration resolved against the spec file, checked to be a calibration of gpu.type."""
    if variant.gpu is None or variant.gpu.calibration is None:
        return None
    from pipeline.costmodel.calibrate import CalibrationError, load

    path = spec.resolve_path(variant.gpu.calibration)
    try:
        load(path, variant.gpu.type)
    except CalibrationError as exc:
        problems.error(("gpu", "calibration"), str(exc))
    return path


def _with_evaluate(
    spec: Spec,
    variant: VariantSpec,
    stages: tuple[StagePlan, ...],
    model_dir: Path | None,
    heads_dir: Path | None,
    gpu: gpus.GpuType | None,
    rehearsal: SpeculativeConfig | None = None,
    rehearsal_heads: Path | None = None,
    calibration: Path | None = None,
    speculative: SpeculativeConfig | None = None,
    kv_cache_fp8: bool = False,
) -> tuple[StagePlan, ...]:
    """The evaluate stage after convert (pipeline/evaluation/ has what it measures). With method: best
    (``rehearsal``, the heads' candidates) it comes before convert and converts the candidates' checkpoint
    itself, so that convert, build and package can follow its choice. On a target without engines (the
    PyTorch backend) it follows the checkpoint stage and converts that checkpoint, the one deployed."""
    from pipeline.evaluation.prompts import prompt_files

    evaluation = variant.evaluation
    assert evaluation is not None
    convert = next((stage for stage in stages if stage.name == "convert"), None)
    after: StagePlan | None = None  # the stage evaluate follows, where it converts for itself
    if convert is None:  # the LLM API's checkpoint, converted by the evaluate stage as convert would
        after = next(stage for stage in stages if stage.name == "checkpoint")
        rehearsal = rehearsal or speculative
        assert rehearsal is not None  # the planner passes the variant's resolved method
        params = {"tp": variant.parallel.tp, "pp": variant.parallel.pp, "dtype": variant.model.dtype}
        params |= {"speculative": jsonable(rehearsal.to_dict()), "kv_cache_fp8": kv_cache_fp8}
        convert = StagePlan("convert", after.output, {"model": after.output}, params)  # not a stage of the plan
    prompts = prompt_files(spec.resolve_path(evaluation.prompts) if evaluation.prompts else None)
    inputs = (
        {
            "checkpoint": convert.output,
            "tokenizer": model_dir or Path("<weights missing>"),
            **{f"prompts{i}": path for i, path in enumerate(prompts)},
        }
        | ({"heads": heads_dir} if heads_dir else {})
        | ({"calibration": calibration} if calibration else {})
    )
    convert_params = convert.params
    if rehearsal is not None:
        del inputs["checkpoint"]
        inputs |= {"model": convert.inputs["model"]} | ({"heads": rehearsal_heads} if rehearsal_heads else {})
        if not rehearsal_heads:
            inputs.pop("heads", None)
        convert_params = convert.params | {"speculative": jsonable(rehearsal.to_dict())}
    look = variant.speculative.lookahead
    stage = StagePlan(
        "evaluate",
        convert.output.parent / "evaluation",
        inputs,
        {
            "evaluation": evaluation.model_dump(),
            "convert": convert_params,
            "lookahead": [look.window, look.ngram, look.verification_set],
            "eagle_dynamic_top_k": variant.speculative.eagle.dynamic_tree_max_top_k,
            "gpu": gpu.name if gpu else None,
            "quantization": variant.quantization.model_dump(),
            "release": variant.release.model_dump() if variant.release else None,
            "method": variant.speculative.method,
        },
    )
    if after is not None:
        at = stages.index(after) + 1
    else:
        at = stages.index(convert) + (0 if rehearsal is not None else 1)
    return (*stages[:at], stage, *stages[at:])


def _inside(root: Path, name: str, problems: _Problems) -> Path:
    """Defence in depth: the name pattern already forbids '/', but never write outside root.

    A legal name leads outside only through a symlink ``root/name`` (a filesystem condition, exit 4,
    naming the link once, before any other check of the variant)."""
    path = (root / name).resolve()
    if root.resolve() not in path.parents:
        if os.path.islink(root / name):
            raise HostFilesystemError(
                f"{root / name} is a symlink to {os.readlink(root / name)}, outside {root}: specdeploy writes only "
                f"inside its output folders; remove the link, or give the other disk as --engines-dir/--triton-repo"
            )
        problems.error(("name",), f"variant name '{name}' would write outside {root}")
    return root / name
