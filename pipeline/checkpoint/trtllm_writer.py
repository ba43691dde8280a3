"""Write a TRT-LLM checkpoint: ``config.json`` and ``rank{r}.safetensors`` streamed part by part.

Memory stays at one chunk per tensor: every tensor is read ``CHUNK_BYTES`` at a time, converted,
checked to be finite (NaN/Inf in a weight is refused naming the tensor, since it is read anyway)
and written. The tp ranks of a pipeline stage are
written side by side (same tensor order in every file) so a row chunk of a row-parallel weight
is read once and its column slices go to each rank.

Crash safety: rank files are written as ``*.partial`` and renamed when complete, and
``config.json`` is written last, so a folder with a config.json is complete.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.checkpoint.hf_reader import FP8
from pipeline.checkpoint.layout import Plan, RankPlan
from pipeline.checkpoint.safetensors_io import HeaderEntry, StreamWriter, itemsize
from pipeline.checkpoint.sharding import Const, OutTensor, Slice, Zeros
from pipeline.errors import InputError, host_error
from pipeline.geometry import ModelGeometry

# Bytes of float32 work per conversion chunk; the peak RSS of a conversion is a small multiple.
CHUNK_BYTES = 8 * 1024 * 1024
FP8_MAX = 448.0
DTYPE_STR = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

Progress = Callable[[int, int], None]
_DONE = object()


def llama_config_dict(spec: ModelGeometry, dtype: torch.dtype, tp: int, pp: int) -> dict[str, Any]:
    rotary_scaling = None
    if spec.rope_scaling is not None:
        # Passed through whole (TRT-LLM's own converters keep only the type, which breaks llama3);
        # "type" is what older TRT-LLM readers look up first.
        rotary_scaling = {"type": spec.rope_scaling["rope_type"], **spec.rope_scaling}
    return {
        "architecture": "LlamaForCausalLM",
        "dtype": DTYPE_STR[dtype],
        "logits_dtype": "float32",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_size": spec.head_dim,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "hidden_act": "silu",
        "norm_epsilon": spec.norm_epsilon,
        "position_embedding_type": "rope_gpt_neox",
        "max_position_embeddings": spec.max_position_embeddings,
        "rotary_base": spec.rope_theta,
        "rotary_scaling": rotary_scaling,
        "use_parallel_embedding": False,
        "embedding_sharding_dim": 0,
        "share_embedding_table": False,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "attn_bias": False,
        "mlp_bias": False,
        "residual_mlp": False,
        "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
    }


@dataclass(frozen=True)
class HeadsConfig:
    medusa: tuple[int, int, int] | None = None  # (num_heads, num_layers, max_draft_len)
    eagle_spec: ModelGeometry | None = None
    eagle: tuple[int, int, int] | None = None  # (num_eagle_layers, max_non_leaves_per_layer, max_draft_len)


def build_config(
    spec: ModelGeometry, dtype: torch.dtype, tp: int, pp: int, plan: Plan, heads: HeadsConfig
) -> dict[str, Any]:
    cfg = llama_config_dict(spec, dtype, tp, pp)
    exclude = ["lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding"]
    if heads.medusa is not None:
        n, layers, max_draft = heads.medusa
        cfg.update(
            architecture="MedusaForCausalLM",
            num_medusa_heads=n,
            num_medusa_layers=layers,
            max_draft_len=max_draft,
            model_type="llama",
        )
        exclude.append("*medusa_heads*")
    if heads.eagle is not None and heads.eagle_spec is not None:
        n, non_leaves, max_draft = heads.eagle
        net = llama_config_dict(heads.eagle_spec, dtype, tp * pp, 1)
        net["quantization"] = {"quant_algo": None, "kv_cache_quant_algo": None}
        cfg.update(
            architecture="EagleForCausalLM",
            num_eagle_layers=n,
            max_non_leaves_per_layer=non_leaves,
            max_draft_len=max_draft,
            eagle_net_config=net,
        )
        exclude += ["*eagle_nets*"] + [f"eagle_nets.{i}.lm_head" for i in range(n)]
    cfg["quantization"] = {
        "quant_algo": plan.quant_algo,
        "kv_cache_quant_algo": plan.kv_cache_quant_algo,
        "exclude_modules": exclude if (plan.quant_algo or plan.kv_cache_quant_algo) else None,
    }
    return cfg


class _RowCache:
    """The last rows read; the next tp rank of a row-parallel weight reads the same rows."""

    def __init__(self) -> None:
        self.key: tuple[int, str, int, int] | None = None
        self.value: torch.Tensor | None = None

    def read(self, part: Slice, start: int, stop: int) -> torch.Tensor:
        ref = part.src.ref
        key = (id(ref.source), ref.name, start, stop)
        if key != self.key:
            self.value = None  # release before reading the next chunk
            self.value = ref.source.read_rows(ref.name, start, stop)
            self.key = key
        assert self.value is not None
        return self.value


def _convert(x: torch.Tensor, part: Slice, out_dtype: torch.dtype) -> torch.Tensor:
    scale = part.src.scale
    if out_dtype == FP8:
        if part.requant is None:
            return x
        assert scale is not None, "requantizing a non-FP8 source"
        y = x.float() * scale / part.requant
        return y.clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    if x.dtype == FP8:
        assert scale is not None, "FP8 source without scale"
        return (x.float() * scale).to(out_dtype)
    return x.to(out_dtype)


def _take_columns(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """x[:, start:stop] made contiguous, copied as bytes by numpy (torch's strided copy of narrow
    rows runs ~10x slower on this path, and row-parallel weights are a third of a model)."""
    size = x.element_size()
    raw = x.view(torch.uint8).numpy()
    block = np.ascontiguousarray(raw[:, start * size : stop * size])
    return torch.from_numpy(block).view(x.dtype)


def _emit(t: OutTensor, writer: StreamWriter, cache: _RowCache) -> Iterator[None]:
    """Write tensor ``t``; yields after each chunk so the tp ranks of a stage can interleave."""
    width = t.row_width
    for part in t.parts:
        if isinstance(part, Const):
            writer.write_tensor_bytes(part.value.to(t.dtype))
            yield
            continue
        if isinstance(part, Zeros):
            step = max(1, CHUNK_BYTES // (width * itemsize(t.dtype)))
            for a in range(0, part.rows, step):
                writer.write_tensor_bytes(torch.zeros((min(step, part.rows - a), width), dtype=t.dtype))
                yield
            continue
        meta = part.src.ref.meta
        step = max(1, CHUNK_BYTES // (meta.row_width * 4))
        for a in range(part.rows[0], part.rows[1], step):
            b = min(a + step, part.rows[1])
            x = cache.read(part, a, b).reshape(b - a, meta.row_width)
            if part.cols is not None:
                x = _take_columns(x, *part.cols)
            y = _convert(x, part, t.dtype)
            _check_finite(y, part, a, t)
            writer.write_tensor_bytes(y)
            del x, y
            yield


def _check_finite(y: torch.Tensor, part: Slice, first_row: int, t: OutTensor) -> None:
    """Refuse NaN/Inf on the way out: corrupt weights, or a value too large for the target dtype."""
    values = y.float() if y.dtype == FP8 else y
    # Any NaN or Inf makes the sum non-finite; it needs no per-element temporary (peak memory). A float32 sum
    # is ~3x faster than a float64 one (bf16, 113 MB); a finite chunk whose sum overflows is looked at row by row.
    if math.isfinite(float(values.sum(dtype=torch.float32))):
        return
    bad = (~torch.isfinite(values)).any(dim=1).nonzero()
    if not len(bad):
        return
    row = first_row + int(bad[0, 0])
    ref = part.src.ref
    source_row = ref.source.read_rows(ref.name, row, row + 1)
    source_finite = bool(torch.isfinite(source_row.float()).all())
    cause = f"overflows {DTYPE_STR.get(t.dtype, t.dtype)}" if source_finite else "holds NaN or Inf"
    fix = "convert in a wider dtype (model.dtype)" if source_finite else "the weights are corrupt; re-export them"
    raise InputError(f"{ref.where} {cause} at row {row} (for {t.name}); {fix}")


def _write_stage(
    out: Path, ranks: list[RankPlan], done: list[int], total: int, progress: Progress | None, created: list[Path]
) -> None:
    names = [[(t.name, t.dtype, t.shape) for t in r.tensors] for r in ranks]
    assert all(n == names[0] for n in names), "tp ranks of a stage must share one tensor layout"
    writers: list[StreamWriter] = []
    try:
        for r in ranks:
            path = out / f"rank{r.rank}.safetensors.partial"
            created.append(path)
            writers.append(StreamWriter(path, [HeaderEntry(t.name, t.dtype, t.shape) for t in r.tensors]))
        cache = _RowCache()
        for i in range(len(ranks[0].tensors)):
            streams = [_emit(r.tensors[i], w, cache) for r, w in zip(ranks, writers, strict=True)]
            while streams:
                streams = [s for s in streams if next(s, _DONE) is not _DONE]
            done[0] += sum(r.tensors[i].nbytes for r in ranks)
            if progress is not None:
                progress(done[0], total)
        for w in writers:
            w.close()
        for r in ranks:
            os.replace(out / f"rank{r.rank}.safetensors.partial", out / f"rank{r.rank}.safetensors")
            created.append(out / f"rank{r.rank}.safetensors")
    finally:
        for w in writers:
            w.abort()


def write_checkpoint(out: Path, plan: Plan, config: dict[str, Any], progress: Progress | None = None) -> None:
    """Write every rank file, then config.json; on any failure remove what was written."""
    out = Path(out)
    total = sum(t.nbytes for r in plan.ranks for t in r.tensors)
    done = [0]
    created: list[Path] = []
    try:
        stages = sorted({r.pp_rank for r in plan.ranks})
        for pp_rank in stages:
            stage = sorted((r for r in plan.ranks if r.pp_rank == pp_rank), key=lambda r: r.tp_rank)
            _write_stage(out, stage, done, total, progress, created)
        tmp = out / "config.json.partial"
        created.append(tmp)
        with open(tmp, "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out / "config.json")
        _fsync_dir(out)
    except OSError as exc:
        _remove(created)
        raise host_error(exc, "writing the TRT-LLM checkpoint") from None
    except BaseException:
        _remove(created)
        raise


def _remove(paths: list[Path]) -> None:
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
