"""Several variants on one GPU server: which GPUs each variant's ranks use, and KV-cache limits that add up.

Each ``tensorrt_llm`` model instance otherwise sizes its paged KV cache from
``kv_cache_free_gpu_mem_fraction`` (0.9) of the GPU memory free when it loads, so the first
instance on a GPU takes nearly all of it and the next one gets almost nothing. Here, with the
plan's own per-GPU estimate (:mod:`pipeline.plan.memory`):

* every rank of a variant needs ``fixed`` = weights + heads + activations + overhead on its GPU,
  and ``kv`` = the KV cache for max_batch_size full sequences (engine max_seq_len each);
* ranks go to ``serving.gpu_device_ids`` when the spec gives them, else to the GPUs with the most
  memory left (the largest variants first; a variant's ranks on distinct GPUs);
* a GPU holds what is placed on it when the sum of ``fixed + kv`` stays within its memory less
  ``RESERVE_FRACTION`` (allocator fragmentation); otherwise the error lists, per GPU, what was
  placed there and by how much it overflows;
* what is left on a GPU is shared among its instances in proportion to their KV caches; an
  instance gets the smallest share over its GPUs, so the limits add up on every GPU;
* the limit is emitted as ``max_tokens_in_paged_kv_cache`` (whole blocks of tokens_per_block):
  TensorRT-LLM takes the smaller of it and the fraction of free memory, so whatever order the
  instances load in, the token limit binds while the fraction stays as the spec says.

Pure planning: nothing here writes a Triton repository. Variants of target ``reference`` run
on the CPU and are not placed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline import targets
from pipeline.errors import InputError
from pipeline.fleet.assign import Engine, assign_gpus
from pipeline.plan.memory import GIB, RESERVE_FRACTION
from pipeline.plan.types import Plan, VariantPlan
from pipeline.spec.gpus import GpuType


@dataclass(frozen=True)
class Instance:
    """One variant's tensorrt_llm model instance on the shared server."""

    variant: str
    gpus: tuple[int, ...]  # rank r runs on gpus[r]
    fixed_gib: float  # per GPU, without the KV cache
    kv_wanted_gib: float  # per GPU: max_batch_size x engine max_seq_len tokens
    kv_gib: float  # per GPU: what the limit below allows
    kv_bytes_per_token: float  # per rank
    max_tokens_in_paged_kv_cache: int

    @property
    def per_gpu_gib(self) -> float:
        return self.fixed_gib + self.kv_gib


@dataclass(frozen=True)
class FleetPlacement:
    gpu: GpuType
    gpu_count: int
    instances: tuple[Instance, ...]

    def on_gpu(self, index: int) -> list[Instance]:
        return [instance for instance in self.instances if index in instance.gpus]

    def used_gib(self, index: int) -> float:
        return sum(instance.per_gpu_gib for instance in self.on_gpu(index))

    @property
    def usable_gib(self) -> float:
        return self.gpu.memory_gib * (1 - RESERVE_FRACTION)


@dataclass(frozen=True)
class _Need:
    variant: VariantPlan
    fixed_gib: float
    kv_gib: float
    bytes_per_token: float

    @property
    def total_gib(self) -> float:
        return self.fixed_gib + self.kv_gib


def _need(variant: VariantPlan) -> _Need:
    m = variant.memory
    tokens = variant.build.max_batch_size * variant.build.engine_max_seq_len
    return _Need(
        variant,
        m.weights_gib + m.heads_gib + m.activations_gib + m.overhead_gib,
        m.kv_cache_gib,
        m.kv_cache_gib * GIB / tokens,
    )


def place_fleet(plan: Plan) -> FleetPlacement | None:
    """The placement of the plan's tensorrt variants on one server (None when there are none);
    InputError when they cannot share its GPUs."""
    shared = {m.variant for g in plan.lora_groups for m in g.members}  # served by their group's engine
    variants = [v for v in plan.variants if targets.on_gpus(v.target) and v.name not in shared]
    if not variants:
        return None
    gpu, count = _server_gpus(variants)
    needs = [_need(v) for v in variants]
    engines = []
    for need in needs:
        v, ids = need.variant, need.variant.serving.gpu_device_ids
        if ids is None and v.world_size > count:
            raise InputError(
                f"variant {v.name} has {v.world_size} ranks but the server has "
                f"{count} GPUs (gpu.count); raise gpu.count or lower tp x pp"
            )
        given = None if ids is None else _given_ids(v, ids, count)
        engines.append(Engine(v.name, v.world_size, need.total_gib, given))
    gpus_of, _ = assign_gpus(engines, count)
    usable = gpu.memory_gib * (1 - RESERVE_FRACTION)
    _check_fits(needs, gpus_of, gpu, count, usable)
    return FleetPlacement(gpu, count, tuple(_limits(need, gpus_of, needs, usable) for need in needs))


def sharing_problem(plan: Plan) -> str | None:
    """Why the spec's variants cannot share one server (their GPUs overflow), or None."""
    try:
        place_fleet(plan)
    except InputError as exc:
        return str(exc)
    return None


def _server_gpus(variants: list[VariantPlan]) -> tuple[GpuType, int]:
    types = {v.gpu.name for v in variants if v.gpu is not None}
    missing = [v.name for v in variants if v.gpu is None]
    if missing:
        raise InputError(
            f"variant(s) {', '.join(missing)} name no gpu.type; variants served together need the "
            "server's GPU type and count (gpu: {type: ..., count: ...})"
        )
    if len(types) > 1:
        raise InputError(f"variants served together must be planned for one GPU type, not {', '.join(sorted(types))}")
    gpu = variants[0].gpu
    assert gpu is not None
    return gpu, max(v.gpu_count or 1 for v in variants)


def _given_ids(variant: VariantPlan, ids: list[int], count: int) -> tuple[int, ...]:
    if len(ids) != variant.world_size or len(set(ids)) != len(ids) or any(i < 0 or i >= count for i in ids):
        raise InputError(
            f"variant {variant.name}: serving.gpu_device_ids {ids} must name {variant.world_size} "
            f"distinct GPUs (one per rank) among 0..{count - 1}"
        )
    return tuple(ids)


def _check_fits(
    needs: list[_Need], gpus_of: dict[str, tuple[int, ...]], gpu: GpuType, count: int, usable: float
) -> None:
    lines = []
    for index in range(count):
        placed = [(n, gpus_of[n.variant.name].index(index)) for n in needs if index in gpus_of[n.variant.name]]
        used = sum(n.total_gib for n, _ in placed)
        if used > usable:
            parts = ", ".join(
                f"{n.variant.name} rank {rank} {n.total_gib:.1f} (KV cache {n.kv_gib:.1f})" for n, rank in placed
            )
            lines.append(
                f"GPU {index} ({gpu.name}, {usable:.1f} of {gpu.memory_gib:.1f} GiB usable): {parts} = "
                f"{used:.1f} GiB, over by {used - usable:.1f} GiB"
            )
    if lines:
        lines.append(
            "the variants do not fit together on these GPUs: lower max_batch_size or max_seq_len, use FP8 "
            "(weights or KV cache), raise tp or gpu.count, or place them with serving.gpu_device_ids"
        )
        raise InputError("\n".join(lines))


def _limits(need: _Need, gpus_of: dict[str, tuple[int, ...]], needs: list[_Need], usable: float) -> Instance:
    name = need.variant.name
    shares = []
    for index in gpus_of[name]:
        others = [n for n in needs if index in gpus_of[n.variant.name]]
        spare = usable - sum(n.total_gib for n in others)
        kv_total = sum(n.kv_gib for n in others)
        shares.append(spare * (need.kv_gib / kv_total) if kv_total else 0.0)
    kv = need.kv_gib + min(shares)
    block = need.variant.build.tokens_per_block
    tokens = math.floor(kv * GIB / need.bytes_per_token / block) * block
    return Instance(
        name,
        gpus_of[name],
        need.fixed_gib,
        need.kv_gib,
        tokens * need.bytes_per_token / GIB,
        need.bytes_per_token,
        tokens,
    )
