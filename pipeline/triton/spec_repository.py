"""Emit ``triton_repo/<spec>/``: every variant of a spec in one model repository, for one tritonserver.

Layout, for variants ``base`` and ``code`` (each keeps its own repository ``triton_repo/<variant>/`` too)::

    <out>/base/, code/                          the ensembles: a client names the variant (--model base)
    <out>/base-tensorrt_llm/, code-tensorrt_llm/ each variant's engine and speculative parameters
    <out>/base-tensorrt_llm_bls/, ...            each variant's BLS model
    <out>/preprocessing/, postprocessing/        shared when every variant's are the same, else
                                                 <first variant of the group>-preprocessing/ ...
    <out>/specdeploy-repository.json            what was packaged, per variant

Pre/postprocessing models are shared by variants whose configs (tokenizer, parameters such as the
Lookahead bounds and the chat template, batch size, instances) and tokenizer files are identical:
fine-tunes of one base usually share them. A variant's tensorrt_llm model keeps everything the
variant's own repository has; variants of target ``tensorrt`` are placed on the spec's GPUs by
:mod:`pipeline.fleet.placement` (``gpu_device_ids`` and a ``max_tokens_in_paged_kv_cache`` per
instance, so that the KV caches add up on every GPU).

Built from the variants' own packaged repositories (their tokenizer copies and chat templates) and
the plan, after every variant's package stage: the configs are generated, never edited.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline.errors import InputError
from pipeline.fleet.placement import place_fleet
from pipeline.plan.types import Plan, VariantPlan
from pipeline.triton import pbtxt
from pipeline.triton.configs import (
    POSTPROCESSING,
    PREPROCESSING,
    ModelNames,
    RepositorySettings,
    all_configs,
    postprocessing_config,
    preprocessing_config,
)
from pipeline.triton.repository import (
    MANIFEST,
    TOKENIZER_SUBDIR,
    check_engine,
    copy_tokenizer,
    settings_from_plan,
    validate_repository,
    with_chat_template,
    with_lora_task,
    write_models,
)


@dataclass(frozen=True)
class _Member:
    variant: VariantPlan
    settings: RepositorySettings
    tokenizer: Path  # the variant's packaged tokenizer folder


def composing_names(variant: str, preprocessing: str, postprocessing: str) -> ModelNames:
    return ModelNames(preprocessing, f"{variant}-tensorrt_llm", postprocessing, f"{variant}-tensorrt_llm_bls")


def emit_spec_repository(
    plan: Plan, out: Path, packaged_root: Path | None = None, *, check_engines: bool = True
) -> dict[str, pbtxt.ModelConfig]:
    """Write the whole-spec repository into ``out`` (an empty or new folder); the configs written.

    Built from each variant's packaged repository (its package stage's output, or
    ``packaged_root/<variant>`` for a repository to review); ``check_engines`` False on a host
    without the engines. A variant packaged without its tokenizer has no chat template here either."""
    out = Path(out)
    placement = place_fleet(plan)  # InputError when the tensorrt variants cannot share the GPUs
    limits = {i.variant: i for i in placement.instances} if placement else {}
    members = []
    for variant in plan.variants:
        packaged = variant.stage("package").output if packaged_root is None else packaged_root / variant.name
        validate_repository(packaged)
        engine_dir = variant.stage("build").output
        if check_engines:
            check_engine(variant, engine_dir)
        tokenizer = packaged / PREPROCESSING / TOKENIZER_SUBDIR
        settings = settings_from_plan(variant, engine_dir, out)
        if tokenizer.is_dir():
            settings = with_chat_template(settings, tokenizer)
        if variant.name in limits:
            instance = limits[variant.name]
            params = settings.tensorrt_llm_parameters | {
                "gpu_device_ids": ",".join(str(i) for i in instance.gpus),
                "max_tokens_in_paged_kv_cache": str(instance.max_tokens_in_paged_kv_cache),
            }
            settings = replace(settings, tensorrt_llm_parameters=params)
        members.append(_Member(variant, replace(settings, ensemble_name=variant.name), tokenizer))
    shared = {m.variant: (g.base_variant, m.task_id) for g in plan.lora_groups for m in g.members}
    for index, member in enumerate(members):  # a shared LoRA fine-tune: its models set its task id
        if member.variant.name in shared:
            settings = with_lora_task(member.settings, shared[member.variant.name][1])
            members[index] = replace(member, settings=settings)
    pre = _shared_names(members, PREPROCESSING, preprocessing_config)
    post = _shared_names(members, POSTPROCESSING, postprocessing_config)
    written: dict[str, pbtxt.ModelConfig] = {}
    entries = []
    for member in members:
        name = member.variant.name
        names = composing_names(name, pre[name], post[name])
        if name in shared:  # served by its LoRA group's engine: no tensorrt_llm model of its own
            names = replace(names, tensorrt_llm=f"{shared[name][0]}-tensorrt_llm")
        settings = replace(member.settings, names=names)
        configs = all_configs(settings)
        if name in shared:
            configs.pop(names.tensorrt_llm)
        clash = sorted(model for model in configs if model in written and model not in (pre[name], post[name]))
        if clash:
            raise InputError(
                f"{plan.spec_file}: variant {name}'s model(s) {', '.join(clash)} collide with another "
                "variant's in the whole-spec repository; rename the variant"
            )
        new = {model: config for model, config in configs.items() if model not in written}
        write_models(new, settings, out)
        for model in {names.preprocessing, names.postprocessing} & set(new) if member.tokenizer.is_dir() else ():
            # Copied, not linked: a hard link would change the source's ctime, which its fingerprint reads.
            copy_tokenizer(member.tokenizer, out / model / TOKENIZER_SUBDIR)
        written.update(new)
        entries.append(_entry(member, settings, names))
        if name in shared:
            entries[-1]["lora_task_id"] = shared[name][1]
    manifest = {"spec": plan.spec_name, "variants": entries}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    validate_repository(out)
    return written


def _shared_names(
    members: list[_Member], kind: str, make: Callable[[RepositorySettings], pbtxt.ModelConfig]
) -> dict[str, str]:
    """Variant -> the name of its ``kind`` model: one per group of variants with identical models."""
    groups: dict[str, list[str]] = {}
    for member in members:
        config = make(member.settings)
        config.name = kind  # the name is what we are choosing
        digest = hashlib.sha256(config.SerializeToString(deterministic=True))
        for file in sorted(member.tokenizer.iterdir()) if member.tokenizer.is_dir() else ():
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
        groups.setdefault(digest.hexdigest(), []).append(member.variant.name)
    if len(groups) == 1:
        return {member.variant.name: kind for member in members}
    return {variant: f"{group[0]}-{kind}" for group in groups.values() for variant in group}


def _entry(member: _Member, settings: RepositorySettings, names: ModelNames) -> dict:
    variant, params = member.variant, settings.tensorrt_llm_parameters
    return {
        "variant": variant.name,
        "method": variant.method,
        "target": variant.target,
        "ensemble": settings.ensemble_name,
        "models": {
            "preprocessing": names.preprocessing,
            "tensorrt_llm": names.tensorrt_llm,
            "postprocessing": names.postprocessing,
            "tensorrt_llm_bls": names.bls,
        },
        "engine_dir": params["gpt_model_path"],
        "tp": variant.tp,
        "pp": variant.pp,
        "gpu_device_ids": [int(i) for i in params["gpu_device_ids"].split(",")],
        "max_tokens_in_paged_kv_cache": int(params.get("max_tokens_in_paged_kv_cache", 0)) or None,
        "decoupled": settings.decoupled,
        "max_batch_size": settings.max_batch_size,
        "max_input_len": variant.build.max_input_len,
    }
