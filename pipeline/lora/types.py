"""The LoRA plan's records: a group's engine and adapters (:class:`LoraGroupPlan`), its LoRA plugin
settings (:class:`LoraBuild`), and the planner's decision per LoRA family (:class:`AutoDecision`).

A leaf the plan's own types import (pipeline/plan/), so that the modules that make these records
(:mod:`pipeline.lora.group`, :mod:`pipeline.lora.auto`) can name the plan's types in turn.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline import methods
from pipeline.fleet.lora_decision import LoraDecision, VariantChoice
from pipeline.lora.memory import LoraCacheSize


@dataclass(frozen=True)
class LoraBuild:
    """The LoRA plugin settings of a group's engine (trtllm-build --lora_plugin/--max_lora_rank/
    --lora_target_modules; build_config.plugin_config.lora_plugin and build_config.lora_config)."""

    plugin_dtype: str  # the engine's dtype
    max_rank: int
    target_modules: tuple[str, ...]


@dataclass(frozen=True)
class LoraMember:
    variant: str
    task_id: int
    adapter: Path
    rank: int  # the largest rank of the adapter (r, or a rank_pattern value)
    modules: tuple[str, ...]  # TensorRT-LLM module names
    bytes_per_gpu: int


@dataclass(frozen=True)
class LoraGroupPlan:
    """One shared engine and its adapters."""

    name: str  # the group's engine and tensorrt_llm model: <base variant>-lora
    base_variant: str | None  # a variant of the spec without adapter on this engine, if any
    members: tuple[LoraMember, ...]
    max_lora_rank: int
    target_modules: tuple[str, ...]
    cache: LoraCacheSize
    engine_gib: float  # the engine's estimate without the LoRA cache (per GPU)
    merged_gib: float  # the same fine-tunes merged: one engine each (per GPU of each engine)
    gpus_per_engine: int

    @property
    def shared_gib(self) -> float:
        return self.engine_gib + self.cache.gpu_gib

    def build(self, dtype: str) -> LoraBuild:
        return LoraBuild(dtype, self.max_lora_rank, self.target_modules)

    def triton_parameters(self, prefetch_dir: PurePosixPath) -> dict[str, str]:
        """The tensorrt_llm model's LoRA cache parameters (TensorRT-LLM's PeftCacheConfig);
        ``prefetch_dir``: the adapters' folder where the deployment mounts it."""
        return {
            "lora_cache_optimal_adapter_size": str(self.cache.optimal_adapter_size),
            "lora_cache_max_adapter_size": str(self.cache.max_adapter_size),
            "lora_cache_host_memory_bytes": str(self.cache.host_bytes),
            "lora_prefetch_dir": str(prefetch_dir),
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["members"] = [{**asdict(m), "adapter": str(m.adapter)} for m in self.members]
        data["shared_gib"] = round(self.shared_gib, 3)
        return data

    def describe(self) -> str:
        n = len(self.members)
        return (
            f"LoRA group {self.name}: {n} fine-tune(s) on one engine, max_lora_rank {self.max_lora_rank}, "
            f"modules {' '.join(self.target_modules)}; {self.shared_gib:.1f} GiB per GPU (engine "
            f"{self.engine_gib:.1f} + LoRA cache {self.cache.gpu_gib:.2f}) on {self.gpus_per_engine} GPU(s), "
            f"against {n} merged engine(s) of {self.merged_gib:.1f} GiB each ({n * self.merged_gib:.1f} GiB "
            f"per GPU slot in all)"
        )


@dataclass(frozen=True)
class AutoDecision:
    """The decision for one LoRA family: the choice per fine-tune, and the solver's result when a GPU
    was weighed (None on the CPU reference target or without gpu.type)."""

    base: str
    choices: tuple[VariantChoice, ...]
    decision: LoraDecision | None
    rule: str  # how it was decided, one line
    shared_method: str | None = None  # what the shared engine runs beside the adapters (None: not weighed)
    # the fleet's predicted speedup with each method the shared engine could run, when more than one
    shared_compared: tuple[tuple[str, float], ...] = ()

    def shared_engine_text(self) -> str:
        """``eagle3`` or, where methods were compared, ``eagle3 (fleet 1.612x; with ngram 1.504x, plain 0.991x)``."""
        name = _shown(self.shared_method)
        if not self.shared_compared:
            return name
        speedups = dict(self.shared_compared)
        others = ", ".join(f"{_shown(m)} {s:.3f}x" for m, s in self.shared_compared if m != self.shared_method)
        return f"{name} (fleet {speedups[str(self.shared_method)]:.3f}x; with {others})"

    @property
    def shared(self) -> set[str]:
        return {c.name for c in self.choices if c.choice == "shared"}

    def to_dict(self) -> dict[str, Any]:
        body = self.decision.to_dict() if self.decision is not None else {"variants": {}}
        body["variants"] = {c.name: c.to_dict() for c in self.choices}
        compared = {m: round(s, 4) for m, s in self.shared_compared}
        shared = {"shared_method": self.shared_method, "shared_methods_compared": compared}
        return {"base": self.base, "rule": self.rule, **shared, **body}

    def lines(self) -> list[str]:
        head = f"LoRA decision for base {self.base}: {self.rule}"
        if self.decision is not None:
            d = self.decision
            head += (
                f"; shared engine {self.shared_engine_text()}"
                f"; fleet speedup {d.fleet_speedup:.2f}x at concurrency {d.concurrency} "
                f"(all shared {d.all_shared_speedup:.2f}x); GiB used per GPU "
                + ", ".join(f"{u:.1f}/{f:.1f}" for u, f in zip(d.used_gib, d.free_gib))
            )
        return [head] + [f"  {c.name}: {c.reason}" for c in self.choices]


def _shown(method: str | None) -> str:
    """A method as the decision's lines name it: plain decoding is ``plain``."""
    return methods.definition(methods.PLAIN).title if method == methods.PLAIN else str(method)
