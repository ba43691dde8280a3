"""Tensor/pipeline-parallel split rules of TensorRT-LLM, as row/column ranges of source tensors.

The plan never materialises a split tensor: each output tensor is a list of *parts* (row ranges
of source tensors, zero padding, small constants) that the writer streams in order. KV-head
replication (``dup_kv_weight`` in TRT-LLM) is a choice of rows, not a copy.

Rules (TRT-LLM ``models/llama/convert.py`` + ``convert_utils.split*`` + ``Mapping``):
* column-parallel (qkv, mlp.fc, mlp.gate, Medusa/EAGLE fc and lm_head): dim 0 chunk ``tp_rank``;
* row-parallel (attention.dense, mlp.proj): dim 1 chunk ``tp_rank``;
* fused qkv per rank = concat(q_r, k_r, v_r); with kv_heads < tp each KV head is repeated
  tp/kv_heads times first, so rank r gets KV head r // (tp/kv_heads);
* lm_head: vocab padded with zero rows to a multiple of tp, then dim 0;
* PP: ``torch.tensor_split(range(L), pp)`` (first L % pp stages get one extra layer), local
  layer names, embedding on the first stage, ln_f/lm_head on the last; rank = pp_rank*tp + tp_rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.checkpoint.safetensors_io import Shaped, TensorRef, numel
from pipeline.errors import InputError


@dataclass(frozen=True)
class Src:
    """A source tensor; ``scale`` is its per-tensor FP8 weight scale when it is stored as float8."""

    ref: TensorRef
    scale: float | None = None


@dataclass(frozen=True)
class Slice:
    """Rows [rows) and optionally columns [cols) of a source, converted to the output dtype.

    ``requant``: the output is float8 with this (shared, fused) scale; the source is dequantized
    with its own scale and re-quantized. None keeps the source codes unchanged.
    """

    src: Src
    rows: tuple[int, int]
    cols: tuple[int, int] | None = None
    requant: float | None = None

    @property
    def nrows(self) -> int:
        return self.rows[1] - self.rows[0]

    def width(self) -> int:
        meta = self.src.ref.meta
        return self.cols[1] - self.cols[0] if self.cols else meta.row_width


@dataclass(frozen=True)
class Zeros:
    rows: int


@dataclass(frozen=True)
class Const:
    value: torch.Tensor


Part = Slice | Zeros | Const


@dataclass(frozen=True)
class OutTensor(Shaped):
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    parts: tuple[Part, ...]

    def check(self) -> None:
        """Parts must tile the output exactly; a mismatch is a converter bug, not bad input."""
        total = 0
        for p in self.parts:
            if isinstance(p, Const):
                total += p.value.numel()
                continue
            rows = p.rows if isinstance(p, Zeros) else p.nrows
            if isinstance(p, Slice) and p.width() != self.row_width:
                raise AssertionError(f"{self.name}: part width {p.width()} != {self.row_width}")
            total += rows * self.row_width
        if total != numel(self.shape):
            raise AssertionError(f"{self.name}: parts cover {total} elements, shape {self.shape}")


def chunk(n: int, tp: int, tp_rank: int, what: str) -> tuple[int, int]:
    """The tp_rank-th of tp equal chunks of range(n)."""
    if n % tp:
        raise InputError(f"{what}: size {n} is not divisible by tp={tp}; choose a tp that divides it")
    per = n // tp
    return tp_rank * per, (tp_rank + 1) * per


def check_heads(num_heads: int, num_kv_heads: int, tp: int, where: str) -> None:
    if num_heads % tp:
        raise InputError(
            f"{where}: num_attention_heads {num_heads} is not divisible by tp={tp}; "
            f"choose tp among {divisors(num_heads)}"
        )
    if num_kv_heads >= tp and num_kv_heads % tp:
        raise InputError(f"{where}: num_key_value_heads {num_kv_heads} is not divisible by tp={tp}")
    if num_kv_heads < tp and tp % num_kv_heads:
        raise InputError(
            f"{where}: tp={tp} is not a multiple of num_key_value_heads {num_kv_heads} "
            "(KV heads can only be replicated a whole number of times)"
        )


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    return max(num_kv_heads // tp, 1)


def qkv_rows(
    num_heads: int, num_kv_heads: int, head_dim: int, tp: int, tp_rank: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """(rows of q_proj, rows of k_proj == rows of v_proj) held by tp_rank."""
    q_per = num_heads // tp
    q = (tp_rank * q_per * head_dim, (tp_rank + 1) * q_per * head_dim)
    if num_kv_heads >= tp:
        kv_per = num_kv_heads // tp
        kv = (tp_rank * kv_per * head_dim, (tp_rank + 1) * kv_per * head_dim)
    else:
        head = tp_rank // (tp // num_kv_heads)
        kv = (head * head_dim, (head + 1) * head_dim)
    return q, kv


def padded_vocab(vocab: int, tp: int) -> int:
    return -(-vocab // tp) * tp


def vocab_rows(vocab: int, tp: int, tp_rank: int) -> tuple[tuple[int, int], int]:
    """(source rows, zero rows after them) of a vocab-parallel lm_head shard."""
    per = padded_vocab(vocab, tp) // tp
    start, stop = tp_rank * per, (tp_rank + 1) * per
    real = (min(start, vocab), min(stop, vocab))
    return real, per - (real[1] - real[0])


def pp_layers(num_layers: int, pp: int, pp_rank: int) -> range:
    """Layers of stage pp_rank, as TRT-LLM's Mapping.pp_layers (torch.tensor_split) assigns them."""
    base, extra = divmod(num_layers, pp)
    start = pp_rank * base + min(pp_rank, extra)
    return range(start, start + base + (1 if pp_rank < extra else 0))


def rank_of(tp_rank: int, pp_rank: int, tp: int) -> int:
    return pp_rank * tp + tp_rank
