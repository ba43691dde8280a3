"""The TRT-LLM 1.2 checkpoint layout: which output tensor of which rank comes from which source rows.

Building the plan touches only headers and per-tensor scales, so every shape or naming problem
is reported before the writer creates a file. FP8 scale fusion lives here too: TRT-LLM keeps
one weight scale for the fused qkv GEMM (max of q, k, v) and one for the fc/gate pair (max of
gate_proj, up_proj); parts whose own scale is smaller are re-quantized to the shared one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.checkpoint.heads import EagleDrafter, MedusaHeads
from pipeline.checkpoint.hf_reader import FP8, HFCheckpoint
from pipeline.checkpoint.sharding import (
    Const,
    OutTensor,
    Part,
    Slice,
    Src,
    Zeros,
    check_heads,
    chunk,
    kv_heads_per_rank,
    pp_layers,
    qkv_rows,
    rank_of,
    vocab_rows,
)
from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry

# Tensors some exporters leave in HF checkpoints that carry no weights TRT-LLM needs.
_IGNORABLE_SUFFIXES = (".rotary_emb.inv_freq",)


@dataclass(frozen=True)
class Settings:
    tp: int
    pp: int
    dtype: torch.dtype
    kv_cache_fp8: bool
    num_eagle_layers: int = 0


@dataclass
class RankPlan:
    rank: int
    tp_rank: int
    pp_rank: int
    tensors: list[OutTensor]


@dataclass
class Plan:
    ranks: list[RankPlan]
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    consumed: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Linear:
    src: Src
    input_scale: float | None


def _fp8_scale(value: float | None) -> float:
    """A scale of an FP8 checkpoint's linear (:meth:`_Builder.linear` makes sure it is there)."""
    assert value is not None, "an FP8 linear without its scale"
    return value


def _scale_const(value: float) -> Const:
    return Const(torch.tensor([value], dtype=torch.float32))


class _Builder:
    def __init__(self, ckpt: HFCheckpoint, settings: Settings):
        self.ckpt = ckpt
        self.s = settings
        self.spec = ckpt.spec
        self.fp8 = ckpt.fp8 is not None
        self.consumed: set[str] = set()
        self.warnings: list[str] = []

    # -- sources ---------------------------------------------------------------------------------

    def tensor(self, name: str, shape: tuple[int, ...], why: str) -> Src:
        ref = self.ckpt.ref(name, why)
        if ref.meta.shape != shape:
            raise InputError(
                f"{ref.where}: shape {list(ref.meta.shape)} does not match config.json ({why} expects {list(shape)})"
            )
        self.consumed.add(name)
        if ref.meta.dtype == FP8:
            scale_name = name[: -len("weight")] + "weight_scale"
            self.consumed.update({scale_name, name[: -len("weight")] + "input_scale"})
            return Src(ref, self.ckpt.scalar(scale_name))
        return Src(ref)

    def linear(self, prefix: str, shape: tuple[int, ...]) -> _Linear:
        src = self.tensor(prefix + ".weight", shape, "linear weight")
        if not self.fp8:
            return _Linear(src, None)
        if src.scale is None:
            raise InputError(
                f"{src.ref.where} is not float8 in an FP8 checkpoint; mixed-precision decoder "
                "layers are not supported (quantize every decoder linear or none)"
            )
        input_scale = self.ckpt.scalar(prefix + ".input_scale")
        return _Linear(src, input_scale)

    # -- output helpers ----------------------------------------------------------------------------

    def weight_dtype(self, quantized: bool) -> torch.dtype:
        return FP8 if quantized else self.s.dtype

    @staticmethod
    def _slice(src: Src, rows: tuple[int, int], cols: tuple[int, int] | None, shared: float | None) -> Slice:
        requant = shared if shared is not None and src.scale != shared else None
        if cols == (0, src.ref.meta.row_width):
            cols = None  # whole rows (tp=1): contiguous bytes, eligible for a kernel copy
        return Slice(src, rows, cols, requant)

    def gemm(
        self,
        name: str,
        linears: list[tuple[_Linear, tuple[int, int]]],
        cols: tuple[int, int] | None,
        width: int,
        shared: float | None = None,
    ) -> list[OutTensor]:
        """One GEMM (qkv fuses three): concat of row ranges, plus FP8 scales when quantized.

        ``shared`` overrides the weight scale (default: max over the fused parts); parts with a
        different scale of their own are re-quantized to it.
        """
        quantized = linears[0][0].src.scale is not None
        if quantized and shared is None:
            shared = max(_fp8_scale(lin.src.scale) for lin, _ in linears)
        parts: list[Part] = [self._slice(lin.src, rows, cols, shared) for lin, rows in linears]
        nrows = sum(r[1] - r[0] for _, r in linears)
        out = [OutTensor(name + ".weight", self.weight_dtype(quantized), (nrows, width), tuple(parts))]
        if quantized:
            act = max(_fp8_scale(lin.input_scale) for lin, _ in linears)
            out.append(
                OutTensor(name + ".weights_scaling_factor", torch.float32, (1,), (_scale_const(_fp8_scale(shared)),))
            )
            out.append(OutTensor(name + ".activation_scaling_factor", torch.float32, (1,), (_scale_const(act),)))
        return out

    def plain(self, name: str, src: Src, rows: tuple[int, int] | None = None, pad: int = 0) -> OutTensor:
        """A float tensor (norm, embedding, head), cast to the model dtype; FP8 sources are dequantized."""
        meta = src.ref.meta
        rows = rows or (0, meta.rows)
        parts: list[Part] = [Slice(src, rows)]
        if pad:
            parts.append(Zeros(pad))
        shape = (rows[1] - rows[0] + pad, *meta.shape[1:])
        return OutTensor(name, self.s.dtype, shape, tuple(parts))

    def zeros(self, name: str, shape: tuple[int, ...]) -> OutTensor:
        return OutTensor(name, self.s.dtype, shape, (Zeros(shape[0]),))

    # -- model pieces ------------------------------------------------------------------------------

    def decoder_layer(
        self,
        hf: str,
        trt: str,
        spec: ModelGeometry,
        tp_rank: int,
        *,
        input_norm: bool,
        srcs: dict[str, Src] | None = None,
        kv_scale: float | None = None,
    ) -> list[OutTensor]:
        """One Llama decoder layer; ``srcs`` supplies EAGLE drafter tensors instead of base-checkpoint names."""
        tp = self.s.tp
        H, d, inter = self.spec.hidden_size, spec.head_dim, spec.intermediate_size
        q_out, kv_out = spec.num_heads * d, spec.num_kv_heads * d

        def lin(key: str, shape: tuple[int, ...]) -> _Linear:
            if srcs is not None:
                return _Linear(srcs[key + ".weight"], None)
            return self.linear(f"{hf}.{key}", shape)

        def norm(key: str) -> Src:
            if srcs is not None:
                return srcs[key + ".weight"]
            return self.tensor(f"{hf}.{key}.weight", (H,), "RMSNorm weight")

        out: list[OutTensor] = []
        if input_norm:
            out.append(self.plain(f"{trt}.input_layernorm.weight", norm("input_layernorm")))
        q_rows, kv_rows = qkv_rows(spec.num_heads, spec.num_kv_heads, d, tp, tp_rank)
        q, k, v = (
            lin("self_attn.q_proj", (q_out, H)),
            lin("self_attn.k_proj", (kv_out, H)),
            lin("self_attn.v_proj", (kv_out, H)),
        )
        out += self.gemm(f"{trt}.attention.qkv", [(q, q_rows), (k, kv_rows), (v, kv_rows)], None, H)
        dense = lin("self_attn.o_proj", (H, q_out))
        out += self.gemm(
            f"{trt}.attention.dense",
            [(dense, (0, H))],
            chunk(q_out, tp, tp_rank, f"{hf}.self_attn.o_proj"),
            q_out // tp,
        )
        if kv_scale is not None:
            out.append(
                OutTensor(f"{trt}.attention.kv_cache_scaling_factor", torch.float32, (1,), (_scale_const(kv_scale),))
            )
        out.append(self.plain(f"{trt}.post_layernorm.weight", norm("post_attention_layernorm")))
        rows = chunk(inter, tp, tp_rank, f"{hf}.mlp intermediate_size")
        gate, up = lin("mlp.gate_proj", (inter, H)), lin("mlp.up_proj", (inter, H))
        # TRT-LLM fuses fc and gate into one GEMM at build time (--use_fused_mlp): one weight scale.
        shared = max(_fp8_scale(gate.src.scale), _fp8_scale(up.src.scale)) if gate.src.scale is not None else None
        out += self.gemm(f"{trt}.mlp.fc", [(gate, rows)], None, H, shared)
        out += self.gemm(f"{trt}.mlp.gate", [(up, rows)], None, H, shared)
        down = lin("mlp.down_proj", (H, inter))
        out += self.gemm(f"{trt}.mlp.proj", [(down, (0, H))], rows, inter // tp)
        return out

    def kv_scale(self, layer: int) -> float | None:
        p = f"model.layers.{layer}.self_attn."
        names = [(p + "k_proj.k_scale", p + "v_proj.v_scale"), (p + "k_scale", p + "v_scale")]
        found = next(((k, v) for k, v in names if self.ckpt.has(k) and self.ckpt.has(v)), None)
        if found is None:
            if self.s.kv_cache_fp8:
                raise InputError(
                    f"{self.ckpt.path}: tensor {names[0][0]} is missing; kv_cache_fp8 needs a "
                    "ModelOpt export calibrated with FP8_KV_CFG (k_scale/v_scale per layer)"
                )
            return None
        self.consumed.update(found)
        if not self.s.kv_cache_fp8:
            return None
        return max(self.ckpt.scalar(found[0]), self.ckpt.scalar(found[1]))

    def lm_head_src(self) -> Src:
        spec = self.spec
        shape = (spec.vocab_size, spec.hidden_size)
        if spec.tie_word_embeddings:
            if self.ckpt.has("lm_head.weight"):
                self.consumed.add("lm_head.weight")  # an alias some exporters write; the embedding is the truth
            return self.tensor("model.embed_tokens.weight", shape, "tied embedding used as lm_head")
        src = self.tensor("lm_head.weight", shape, "lm_head")
        if src.scale is not None:
            self.warnings.append(
                f"{src.ref.where}: FP8 lm_head dequantized to {self.s.dtype} (lm_head stays "
                "high precision in TRT-LLM FP8 checkpoints)"
            )
        return src

    def lm_head(self, name: str, src: Src, tp_rank: int) -> OutTensor:
        rows, pad = vocab_rows(self.spec.vocab_size, self.s.tp, tp_rank)
        return self.plain(name, src, rows, pad)


def build_plan(
    ckpt: HFCheckpoint, settings: Settings, medusa: MedusaHeads | None = None, eagle: EagleDrafter | None = None
) -> Plan:
    spec = ckpt.spec
    tp, pp = settings.tp, settings.pp
    where = str(ckpt.path / "config.json")
    check_heads(spec.num_heads, spec.num_kv_heads, tp, where)
    if pp > spec.num_layers:
        raise InputError(f"{where}: pp={pp} exceeds num_hidden_layers {spec.num_layers}")
    if settings.kv_cache_fp8 and (ckpt.fp8 is None or not ckpt.fp8.kv_scales):
        raise InputError(
            f"{ckpt.path}: kv_cache_fp8 needs a ModelOpt FP8 export calibrated with FP8_KV_CFG "
            "(hf_quant_config.json kv_cache_quant_algo FP8); re-quantize or drop kv_cache_fp8"
        )
    if eagle is not None:
        if pp != 1:
            raise InputError(f"EAGLE needs pp=1 (TRT-LLM: pipeline parallelism is not supported in EAGLE), got pp={pp}")
        if settings.kv_cache_fp8:
            raise InputError(
                "kv_cache_fp8 with EAGLE is not supported: the drafter shares the KV cache and has "
                "no calibrated KV scales; drop kv_cache_fp8"
            )
        check_heads(eagle.spec.num_heads, eagle.spec.num_kv_heads, tp, f"{eagle.fc_weight.ref.source.label} drafter")
    if (medusa is not None or eagle is not None) and spec.hidden_size % tp:
        raise InputError(
            f"{where}: hidden_size {spec.hidden_size} is not divisible by tp={tp} "
            "(Medusa/EAGLE head linears are split on it)"
        )

    b = _Builder(ckpt, settings)
    if ckpt.fp8 is not None and ckpt.fp8.kv_scales and not settings.kv_cache_fp8:
        b.warnings.append(
            f"{ckpt.path}: the export has FP8 KV-cache scales but kv_cache_fp8 is off; "
            "the KV cache stays in the model dtype"
        )
    H, V = spec.hidden_size, spec.vocab_size
    lm_src = b.lm_head_src()
    ranks: list[RankPlan] = []
    for pp_rank in range(pp):
        layers = pp_layers(spec.num_layers, pp, pp_rank)
        for tp_rank in range(tp):
            out: list[OutTensor] = []
            if pp_rank == 0:
                out.append(
                    b.plain(
                        "transformer.vocab_embedding.weight", b.tensor("model.embed_tokens.weight", (V, H), "embedding")
                    )
                )
            for local, layer in enumerate(layers):
                kv = b.kv_scale(layer)
                out += b.decoder_layer(
                    f"model.layers.{layer}", f"transformer.layers.{local}", spec, tp_rank, input_norm=True, kv_scale=kv
                )
            if pp_rank == pp - 1:
                out.append(b.plain("transformer.ln_f.weight", b.tensor("model.norm.weight", (H,), "final norm")))
                out.append(b.lm_head("lm_head.weight", lm_src, tp_rank))
            if medusa is not None:
                # TRT-LLM's Medusa model declares the heads on every pp rank (used on the last one only).
                out += _medusa_tensors(b, medusa, tp_rank)
            if eagle is not None:
                out += _eagle_tensors(b, eagle, lm_src, tp_rank, settings.num_eagle_layers)
            for t in out:
                t.check()
            ranks.append(RankPlan(rank_of(tp_rank, pp_rank, tp), tp_rank, pp_rank, out))
    if medusa is not None:
        b.consumed |= medusa.consumed
    quant_algo = "FP8" if ckpt.fp8 is not None else None
    kv_algo = "FP8" if settings.kv_cache_fp8 else None
    plan = Plan(ranks, quant_algo, kv_algo, b.consumed, b.warnings)
    _check_unused(ckpt, plan)
    return plan


def _medusa_tensors(b: _Builder, medusa: MedusaHeads, tp_rank: int) -> list[OutTensor]:
    tp, H = b.s.tp, b.spec.hidden_size
    rows = chunk(H, tp, tp_rank, "Medusa linear")
    out: list[OutTensor] = []
    for h in range(medusa.num_heads):
        for layer in range(medusa.num_layers):
            name = f"medusa_heads.{h}.medusa_layers.{layer}.linear"
            out.append(b.plain(f"{name}.weight", medusa.linear_weight[h][layer], rows))
            out.append(b.plain(f"{name}.bias", medusa.linear_bias[h][layer], rows))
        # TRT-LLM's MedusaHead lm_head is ColumnLinear(vocab_size_padded): pad like the base lm_head.
        out.append(b.lm_head(f"medusa_heads.{h}.lm_head.weight", medusa.lm_head[h], tp_rank))
    return out


def _eagle_tensors(b: _Builder, eagle: EagleDrafter, lm_src: Src, tp_rank: int, copies: int) -> list[OutTensor]:
    tp, H = b.s.tp, b.spec.hidden_size
    rows = chunk(H, tp, tp_rank, "EAGLE fc")
    net: list[OutTensor] = [
        b.plain("drafter.vocab_embedding.weight", eagle.embedding),
        b.plain("drafter.fc.weight", eagle.fc_weight, rows),
    ]
    if eagle.fc_bias is not None:
        net.append(b.plain("drafter.fc.bias", eagle.fc_bias, rows))
    else:
        net.append(b.zeros("drafter.fc.bias", (rows[1] - rows[0],)))
    for j, layer in enumerate(eagle.layers):
        net += b.decoder_layer(
            f"{eagle.fc_weight.ref.source.label} layers.{j}",
            f"drafter.layers.{j}",
            eagle.spec,
            tp_rank,
            input_norm=j > 0,
            srcs=layer,
        )
    net.append(b.lm_head("lm_head.weight", lm_src, tp_rank))
    return [OutTensor(f"eagle_nets.{i}.{t.name}", t.dtype, t.shape, t.parts) for i in range(copies) for t in net]


def _check_unused(ckpt: HFCheckpoint, plan: Plan) -> None:
    unused = sorted(n for n in ckpt.tensors if n not in plan.consumed and not n.endswith(_IGNORABLE_SUFFIXES))
    if not unused:
        return
    first = unused[0]
    hint = ""
    if first.startswith("medusa_heads."):
        hint = "; the checkpoint has Medusa heads: pass medusa options to convert them"
    elif first.startswith("eagle_module."):
        hint = "; ModelOpt combined EAGLE checkpoints are not supported: export the drafter separately"
    more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
    raise InputError(f"{ckpt.ref(first).where}: unexpected tensor{more}; it would be silently dropped{hint}")


__all__ = ["Plan", "RankPlan", "Settings", "build_plan", "kv_heads_per_rank"]
