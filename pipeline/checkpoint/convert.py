"""Public entry point: HF Llama (plain or ModelOpt FP8) + optional Medusa/EAGLE heads -> TRT-LLM 1.2.

Order of work: open headers, load/validate heads, build the full per-rank plan (every
shape/name/TP check), and only then write. A bad input therefore fails before any file exists;
a failure while writing removes what was written (see trtllm_writer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipeline.checkpoint.heads import EagleOptions, MedusaHeads, MedusaOptions, load_eagle, load_medusa
from pipeline.checkpoint.hf_reader import HFCheckpoint, open_hf_checkpoint
from pipeline.checkpoint.layout import Plan, Settings, build_plan
from pipeline.checkpoint.trtllm_writer import HeadsConfig, build_config, write_checkpoint
from pipeline.errors import InputError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class CheckpointSummary:
    out: Path
    architecture: str
    dtype: str
    tp: int
    pp: int
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    files: tuple[str, ...]
    total_bytes: int
    num_tensors: int
    num_medusa_heads: int | None = None
    num_eagle_layers: int | None = None
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


def convert_checkpoint(
    src: Path,
    out: Path,
    *,
    tp: int,
    pp: int,
    dtype: str,
    medusa: MedusaOptions | None = None,
    eagle: EagleOptions | None = None,
    kv_cache_fp8: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> CheckpointSummary:
    """Convert ``src`` into ``out`` (an existing empty folder; the caller renames it into place).

    ``dtype`` is the dtype of every unquantized tensor; FP8 linears of a ModelOpt export stay FP8.
    ``progress(done_bytes, total_bytes)`` is called after each tensor.
    """
    _check_arguments(tp, pp, dtype, medusa, eagle)
    out = Path(out)
    if not out.is_dir():
        raise InputError(f"{out}: output folder must exist (an empty temp folder the caller renames)")
    if any(out.iterdir()):
        raise InputError(f"{out}: output folder is not empty")
    ckpt = open_hf_checkpoint(Path(src))
    try:
        prepared = _prepare(ckpt, tp, pp, dtype, medusa, eagle, kv_cache_fp8)
        write_checkpoint(out, prepared.plan, prepared.config, progress)
    finally:
        ckpt.close()
    plan, config, medusa_heads = prepared.plan, prepared.config, prepared.medusa_heads
    files = tuple(f"rank{r.rank}.safetensors" for r in sorted(plan.ranks, key=lambda r: r.rank))
    return CheckpointSummary(
        out=out,
        architecture=config["architecture"],
        dtype=dtype,
        tp=tp,
        pp=pp,
        quant_algo=plan.quant_algo,
        kv_cache_quant_algo=plan.kv_cache_quant_algo,
        files=("config.json", *files),
        total_bytes=sum(t.nbytes for r in plan.ranks for t in r.tensors),
        num_tensors=sum(len(r.tensors) for r in plan.ranks),
        num_medusa_heads=medusa_heads.num_heads if medusa_heads is not None else None,
        num_eagle_layers=eagle.num_eagle_layers if eagle is not None else None,
        warnings=prepared.warnings,
    )


def check_checkpoint(
    src: Path,
    *,
    tp: int,
    pp: int,
    dtype: str,
    medusa: MedusaOptions | None = None,
    eagle: EagleOptions | None = None,
    kv_cache_fp8: bool = False,
) -> tuple[str, ...]:
    """Every check :func:`convert_checkpoint` makes before it writes (config, safetensors headers, heads
    against the base, the per-rank plan), reading no tensor data but FP8 scales; returns the warnings.

    What it cannot know is in the values: NaN/Inf are found while the tensors stream through convert.
    """
    _check_arguments(tp, pp, dtype, medusa, eagle)
    ckpt = open_hf_checkpoint(Path(src))
    try:
        return _prepare(ckpt, tp, pp, dtype, medusa, eagle, kv_cache_fp8).warnings
    finally:
        ckpt.close()


def _check_arguments(tp: int, pp: int, dtype: str, medusa: MedusaOptions | None, eagle: EagleOptions | None) -> None:
    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
    for name, value in (("tp", tp), ("pp", pp)):
        if not isinstance(value, int) or value < 1:
            raise InputError(f"{name} must be a positive integer, got {value!r}")
    if medusa is not None and eagle is not None:
        raise InputError("choose Medusa or EAGLE heads, not both")


@dataclass(frozen=True)
class _Prepared:
    plan: Plan
    config: dict
    medusa_heads: MedusaHeads | None
    warnings: tuple[str, ...]


def _prepare(
    ckpt: HFCheckpoint,
    tp: int,
    pp: int,
    dtype: str,
    medusa: MedusaOptions | None,
    eagle: EagleOptions | None,
    kv_cache_fp8: bool,
) -> _Prepared:
    medusa_heads = load_medusa(medusa, ckpt) if medusa is not None else None
    drafter = load_eagle(eagle, ckpt) if eagle is not None else None
    settings = Settings(
        tp=tp,
        pp=pp,
        dtype=DTYPES[dtype],
        kv_cache_fp8=kv_cache_fp8,
        num_eagle_layers=eagle.num_eagle_layers if eagle is not None else 0,
    )
    plan = build_plan(ckpt, settings, medusa_heads, drafter)
    heads = HeadsConfig(
        medusa=(medusa_heads.num_heads, medusa_heads.num_layers, medusa.max_draft_len)
        if medusa_heads is not None and medusa is not None
        else None,
        eagle_spec=drafter.spec if drafter is not None else None,
        eagle=(eagle.num_eagle_layers, eagle.max_non_leaves_per_layer, eagle.max_draft_len)
        if eagle is not None
        else None,
    )
    config = build_config(ckpt.spec, DTYPES[dtype], tp, pp, plan, heads)
    warnings = list(plan.warnings)
    if medusa_heads is not None:
        warnings += medusa_heads.warnings
    if drafter is not None:
        warnings += drafter.warnings
    return _Prepared(plan, config, medusa_heads, tuple(warnings))
