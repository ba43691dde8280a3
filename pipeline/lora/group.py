"""LoRA groups: fine-tunes served as adapters of one shared engine instead of merged engines of their own.

A variant whose ``model.adapter`` is its only difference from a base (same base model, dtype,
quantization, parallelism, build limits, target and GPUs) can be served by the base's engine built
with the LoRA plugin. ``serving.lora`` decides per variant:

* ``shared``: the variant joins its base's LoRA group. The group gets one engine with
  ``max_lora_rank`` the largest rank of its adapters and ``lora_target_modules`` their union, each
  adapter a stable ``lora_task_id`` (from the variant's name, so adding fine-tunes never renumbers
  the others) and the LoRA cache sized from its adapters (:mod:`pipeline.lora.memory`). Such a
  variant decodes plainly (:func:`pipeline.lora.rules.speculative_refusal`): ``speculative.method:
  auto`` resolves to ``none``, an explicit method is refused.
* ``merged``: the adapter is merged into a copy of the base with an engine of its own (the merge
  stage), which may use any speculative method.
* ``auto`` (the default): the planner chooses between the two per fine-tune, weighing every GPU's
  memory against each fine-tune's predicted speedup (:mod:`pipeline.lora.auto`).

Example: a base and two fine-tunes with ``serving.lora: shared`` plan as one group
``<base>-lora`` with members ``{"support-ft": 1486427391, "legal-ft": 92314585}`` (task ids).
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable
from typing import Any, Protocol

from pipeline import methods, targets
from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.lora.memory import adapter_bytes, cache_size
from pipeline.lora.rules import BFLOAT16_REFUSAL, HF_TO_TRTLLM, MODULE_IDS, speculative_refusal
from pipeline.lora.types import LoraGroupPlan, LoraMember
from pipeline.plan.adapters import AdapterConfig, check_adapter_folder
from pipeline.plan.memory import BYTES_PER_ELEMENT
from pipeline.plan.types import VariantPlan
from pipeline.spec.document import Spec, VariantSpec


class _Problems(Protocol):
    def error(self, path: tuple, message: str) -> None: ...

    def note(self, message: str) -> None: ...


def task_id(variant: str) -> int:
    """A stable task id in [1, 2**31): TensorRT-LLM's prefetch folders are parsed with std::stoi.

    >>> task_id("support-ft") == task_id("support-ft")
    True
    """
    return zlib.crc32(variant.encode()) % (2**31 - 1) + 1


def base_key(variant: VariantSpec) -> str:
    """What must be equal for two variants to share an engine: everything but the adapter and the
    speculative method (a shared engine decodes plainly) and the serving settings of its name."""
    data = variant.model_dump(mode="json")
    data["model"].pop("adapter", None)
    for key in ("name", "speculative", "heads", "evaluation", "release", "traffic"):
        data.pop(key, None)
    serving = data.pop("serving")
    data["serving"] = {k: serving[k] for k in ("kv_cache_free_gpu_mem_fraction", "batch_scheduler_policy")}
    return json.dumps(data, sort_keys=True)


def hf_modules(config: AdapterConfig, num_layers: int) -> set[str]:
    """The HF projection names an adapter targets (a list of names or PEFT's full-match regex)."""
    targets = config.target_modules
    if targets is None:
        return set()
    names = {**{m: "self_attn" for m in ("q_proj", "k_proj", "v_proj", "o_proj")}}
    names.update({m: "mlp" for m in ("gate_proj", "up_proj", "down_proj")})
    if isinstance(targets, str):
        return {
            m
            for m, block in names.items()
            for layer in range(num_layers)
            if re.fullmatch(targets, f"model.layers.{layer}.{block}.{m}")
        }
    return {t.rsplit(".", 1)[-1] for t in targets}


def check_shared_variant(spec: Spec, variant: VariantSpec, problems: _Problems) -> VariantSpec:
    """A ``serving.lora: shared`` variant as it is planned: plain decoding (``auto`` resolves to
    ``none``), one adapter the LoRA plugin can apply. Returns the variant to plan (maybe updated)."""
    if variant.serving.lora != "shared":
        return variant
    if not variant.model.adapters:  # a base: shared set for the whole fleet at the top of the spec
        return variant
    if len(variant.model.adapters) != 1:
        problems.error(
            ("serving", "lora"),
            "shared needs exactly one model.adapter (a LoRA engine applies one adapter per request); "
            "merge the list into one adapter, or use serving.lora: merged",
        )
        return variant
    if not targets.definition(variant.target).lora_on_bfloat16 and variant.model.dtype == "bfloat16":
        problems.error(("serving", "lora"), f"shared on a bfloat16 engine: {BFLOAT16_REFUSAL}")
    method = variant.speculative.method
    if method == "auto" and targets.definition(variant.target).lora_speculative_methods:
        return variant  # auto chooses among the methods the target runs on a LoRA engine
    if method == "auto":
        problems.note(
            "serving.lora shared: speculative.method auto resolves to none: TensorRT-LLM 1.2.1's engine flow "
            "combines the LoRA plugin with no speculative mode (docs: guides/fine-tunes-and-heads, "
            "'Many fine-tunes on one engine')"
        )
        return variant.model_copy(
            update={"speculative": variant.speculative.model_copy(update={"method": methods.PLAIN})}
        )
    refusal = speculative_refusal(method, variant.target)
    if refusal is not None:
        problems.error(("speculative", "method"), f"{method} with serving.lora shared: {refusal}")
    return variant


def _adapter_problem(config: AdapterConfig, modules: set[str]) -> str | None:
    if config.use_dora:
        return "DoRA (use_dora) cannot be applied by TensorRT-LLM's LoRA plugin"
    if config.modules_to_save:
        return f"modules_to_save {list(config.modules_to_save)} are full copies the LoRA plugin cannot apply"
    unknown = sorted(m for m in modules if m not in HF_TO_TRTLLM)
    if unknown:
        return f"target module(s) {unknown} are not LoRA plugin modules ({', '.join(HF_TO_TRTLLM)})"
    if not modules:
        return "targets none of the decoder projections"
    return None


def plan_groups(
    spec: Spec,
    plans: list[VariantPlan],
    problems_for: Callable[[str], _Problems],
    variants: list[VariantSpec] | None = None,
) -> list[LoraGroupPlan]:
    """The spec's LoRA groups from its planned variants (``plans``: VariantPlan, in spec order;
    ``variants``: the variant specs as planned, serving.lora auto already decided; default the spec's).

    ``problems_for(variant_name)`` gives the variant's problem collector (errors at its spec lines)."""
    variants = list(spec.variants) if variants is None else variants
    by_name = {v.name: v for v in variants}
    groups: dict[str, list[Any]] = {}
    for plan in plans:
        variant = by_name[plan.name]
        if variant.serving.lora == "shared" and variant.model.adapters:
            groups.setdefault(base_key(variant), []).append(plan)
    result = []
    for key, members in groups.items():
        base = next((v.name for v in variants if not v.model.adapters and base_key(v) == key), None)
        if base is None:
            problems_for(members[0].name).error(
                ("serving", "lora"),
                "shared needs the group's engine: a variant without model.adapter on the same base, dtype, "
                "quantization, parallel, build, target and gpu (e.g. `- name: base`); add one",
            )
            continue
        result.append(_plan_group(spec, by_name, base, members, problems_for))
    return [g for g in result if g is not None]


def _plan_group(
    spec: Spec,
    by_name: dict[str, VariantSpec],
    base: str | None,
    members: list[VariantPlan],
    problems_for: Callable[[str], _Problems],
) -> LoraGroupPlan | None:
    first = members[0]
    arch: ModelGeometry = first.arch
    dtype_bytes = BYTES_PER_ELEMENT[by_name[first.name].model.dtype]
    tp = first.tp
    explicit = first.build.extra_flags.get("max_lora_rank") if isinstance(first.build.extra_flags, dict) else None
    found: list[tuple[Any, AdapterConfig, int, set[str]]] = []
    for plan in members:
        variant, problems = by_name[plan.name], problems_for(plan.name)
        folder = spec.resolve_path(variant.model.adapters[0])
        try:
            config = check_adapter_folder(folder, require_weights=plan.weights_present)
        except InputError:
            continue  # plan_merge reported it at model.adapter
        modules = hf_modules(config, arch.num_layers)
        problem = _adapter_problem(config, modules)
        rank = max([config.r, *config.rank_pattern.values()])
        if problem is None and explicit is not None and rank > int(explicit):
            problem = f"rank {rank} is over the engine's max_lora_rank {explicit} (build.extra_flags)"
        if problem is not None:
            problems.error(("model", "adapter"), f"{config.file}: {problem}; use serving.lora: merged for it")
            continue
        found.append((plan, config, rank, modules))
    if not found:
        return None
    ids: dict[int, str] = {}
    for plan, *_ in found:
        tid = task_id(plan.name)
        if tid in ids:
            problems_for(plan.name).error(
                ("name",), f"its lora_task_id {tid} collides with variant {ids[tid]}; rename one"
            )
        ids[tid] = plan.name
    modules_union = sorted({HF_TO_TRTLLM[m] for *_, mods in found for m in mods}, key=MODULE_IDS.__getitem__)
    max_rank = int(explicit) if explicit is not None else max(rank for _, _, rank, _ in found)
    built = [
        LoraMember(
            plan.name,
            task_id(plan.name),
            spec.resolve_path(by_name[plan.name].model.adapters[0]),
            rank,
            tuple(sorted((HF_TO_TRTLLM[m] for m in mods), key=MODULE_IDS.__getitem__)),
            adapter_bytes(arch, rank, [HF_TO_TRTLLM[m] for m in mods], dtype_bytes, tp),
        )
        for plan, _, rank, mods in found
    ]
    cache = cache_size(arch, [m.rank for m in built], modules_union, dtype_bytes, first.build.max_batch_size, tp)
    engine = first.memory.total_gib - first.memory.heads_gib
    name = f"{base or first.name}-lora"
    return LoraGroupPlan(
        name,
        base,
        tuple(built),
        max_rank,
        tuple(modules_union),
        cache,
        engine,
        first.memory.total_gib,
        first.world_size,
    )
