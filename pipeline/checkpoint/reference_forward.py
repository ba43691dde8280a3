"""A plain-PyTorch forward over a TRT-LLM checkpoint folder, computed rank by rank.

This is what proves a conversion exact: each tp rank multiplies only its own shards
(column-parallel qkv/fc/gate, row-parallel dense/proj partial sums), the partial sums are
all-reduced (summed) across the tp ranks of a stage, pipeline stages run their layers in
order, and vocab-parallel outputs are gathered and stripped of padding. The rank files are
read with the official ``safetensors`` library, independently of our writer.

FP8 checkpoints run as the engine would: weights dequantized (``w.float() * weights_scaling_factor``),
inputs of every FP8 linear quantized-dequantized with its ``activation_scaling_factor``, and K/V
fake-quantized with ``kv_cache_scaling_factor`` when the KV cache is FP8.

Layer math is exposed as pure functions for the runtime (KV cache, incremental decoding):

* ``attention(shard, x, position_ids, geo, inv_freq, past=None, mask=None) -> (partial, KVCache)``:
  ``x`` [T, H] is the normed input, ``position_ids`` [T] absolute positions, ``past`` the rank's
  cached K/V (already rotated), ``mask`` an optional bool [T, past+T] (True = may attend;
  default causal). The returned partial must be summed over tp ranks.
* ``mlp(shard, x) -> partial`` (sum over tp ranks).
* ``decoder_layer(shards, h, ...)`` does both with the residuals and the all-reduce.
* ``ReferenceModel.hidden_states(ids, position_ids, past, mask)`` returns the final-normed hidden
  states and the new per-layer, per-rank KV caches.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open

from pipeline.errors import InputError

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def fake_quant_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Per-tensor FP8 E4M3 quantize-dequantize, as the engine quantizes GEMM inputs and KV."""
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * scale


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_inv_freq(head_size: int, base: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies for rope_gpt_neox, with ``linear`` or ``llama3`` scaling applied."""
    inv = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.int64).float() / head_size))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv / factor
    if kind == "llama3":
        # Meta's Llama 3.1 rule: long wavelengths slowed by `factor`, short ones kept, a smooth
        # blend between the low/high frequency cut-offs of the original context length.
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, blended, scaled)
    raise InputError(f"rotary_scaling type {kind!r} is not supported by the reference forward "
                     "(default, linear, llama3)")


def rope_tables(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [T, d] of the rotary angles at these positions (shared by every layer of a step)."""
    freqs = position_ids.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [heads, T, d]; rotate-half (GPT-NeoX) convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def apply_rope(x: torch.Tensor, position_ids: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    return rotate(x, *rope_tables(position_ids, inv_freq))


@dataclass
class Linear:
    weight: torch.Tensor  # float32 [out, in], dequantized if stored as FP8
    act_scale: float | None = None  # FP8 linear: its inputs are fake-quantized with this scale
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_scale is not None:
            x = fake_quant_fp8(x, self.act_scale)
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


@dataclass
class LayerShard:
    """One tp rank's part of a decoder layer."""

    input_layernorm: torch.Tensor | None  # None for EAGLE's first drafter layer
    qkv: Linear
    dense: Linear
    post_layernorm: torch.Tensor
    fc: Linear
    gate: Linear
    proj: Linear
    kv_cache_scale: float | None = None


@dataclass(frozen=True)
class Geometry:
    heads: int  # query heads on this rank
    kv_heads: int  # KV heads on this rank (after replication)
    head_size: int
    eps: float


@dataclass
class KVCache:
    k: torch.Tensor  # [kv_heads, T, d], rotated (and fake-quantized for an FP8 KV cache)
    v: torch.Tensor

    @property
    def length(self) -> int:
        return self.k.shape[1]


def causal_mask(q_len: int, past_len: int) -> torch.Tensor:
    keys = torch.arange(past_len + q_len)
    return keys[None, :] <= (past_len + torch.arange(q_len))[:, None]


def attention(w: LayerShard, x: torch.Tensor, position_ids: torch.Tensor, geo: Geometry, inv_freq: torch.Tensor,
              past: KVCache | None = None, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
    T, d = x.shape[0], geo.head_size
    qkv = w.qkv(x)
    q, k, v = qkv.split([geo.heads * d, geo.kv_heads * d, geo.kv_heads * d], dim=-1)
    q = apply_rope(q.view(T, geo.heads, d).transpose(0, 1), position_ids, inv_freq)
    k = apply_rope(k.view(T, geo.kv_heads, d).transpose(0, 1), position_ids, inv_freq)
    v = v.view(T, geo.kv_heads, d).transpose(0, 1)
    if w.kv_cache_scale is not None:
        k, v = fake_quant_fp8(k, w.kv_cache_scale), fake_quant_fp8(v, w.kv_cache_scale)
    if past is not None:
        k, v = torch.cat((past.k, k), dim=1), torch.cat((past.v, v), dim=1)
    past_len = 0 if past is None else past.length
    group = geo.heads // geo.kv_heads
    scores = q @ k.repeat_interleave(group, dim=0).transpose(1, 2) / math.sqrt(d)
    allowed = causal_mask(T, past_len) if mask is None else mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    ctx = torch.softmax(scores, dim=-1) @ v.repeat_interleave(group, dim=0)
    return w.dense(ctx.transpose(0, 1).reshape(T, geo.heads * d)), KVCache(k, v)


def mlp(w: LayerShard, x: torch.Tensor) -> torch.Tensor:
    # TRT-LLM GatedMLP: fc (= HF gate_proj) is activated, gate (= HF up_proj) multiplies it.
    return w.proj(F.silu(w.fc(x)) * w.gate(x))


def decoder_layer(shards: Sequence[LayerShard], h: torch.Tensor, position_ids: torch.Tensor, geo: Geometry,
                  inv_freq: torch.Tensor, past: Sequence[KVCache] | None = None, mask: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, list[KVCache]]:
    """Residual + all-reduced attention, residual + all-reduced MLP, over the tp shards of one layer."""
    norm_in = shards[0].input_layernorm
    x = rms_norm(h, norm_in, geo.eps) if norm_in is not None else h
    partials, caches = [], []
    for r, w in enumerate(shards):
        p, kv = attention(w, x, position_ids, geo, inv_freq, None if past is None else past[r], mask)
        partials.append(p)
        caches.append(kv)
    h = h + torch.stack(partials).sum(0)
    x = rms_norm(h, shards[0].post_layernorm, geo.eps)
    h = h + torch.stack([mlp(w, x) for w in shards]).sum(0)
    return h, caches


@dataclass
class MedusaShard:
    layers: list[Linear]  # rows of x + silu(W x + b), this rank's output slice
    lm_head: torch.Tensor


@dataclass
class EagleShard:
    embedding: torch.Tensor
    fc: Linear
    layers: dict[int, LayerShard]
    lm_head: torch.Tensor


@dataclass
class RankWeights:
    rank: int
    tp_rank: int
    pp_rank: int
    embedding: torch.Tensor | None = None
    layers: dict[int, LayerShard] = field(default_factory=dict)  # by global layer index
    ln_f: torch.Tensor | None = None
    lm_head: torch.Tensor | None = None
    medusa: list[MedusaShard] = field(default_factory=list)
    eagle: list[EagleShard] = field(default_factory=list)

    @classmethod
    def load(cls, ckpt_dir: Path, rank: int, config: dict[str, Any]) -> RankWeights:
        m = config["mapping"]
        tp, pp = m["tp_size"], m["pp_size"]
        path = Path(ckpt_dir) / f"rank{rank}.safetensors"
        if not path.exists():
            raise InputError(f"{path}: missing rank file (mapping says world_size {tp * pp})")
        w = cls(rank, rank % tp, rank // tp)
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            get = _Getter(f, names, path)
            if "transformer.vocab_embedding.weight" in names:
                w.embedding = get.f32("transformer.vocab_embedding.weight")
            first = _pp_first_layer(config["num_hidden_layers"], pp, w.pp_rank)
            local = 0
            while f"transformer.layers.{local}.post_layernorm.weight" in names:
                w.layers[first + local] = get.layer(f"transformer.layers.{local}")
                local += 1
            if "transformer.ln_f.weight" in names:
                w.ln_f = get.f32("transformer.ln_f.weight")
                w.lm_head = get.f32("lm_head.weight")
            for h in range(config.get("num_medusa_heads", 0)):
                p = f"medusa_heads.{h}"
                layers = [get.linear(f"{p}.medusa_layers.{i}.linear", bias=True)
                          for i in range(config["num_medusa_layers"])]
                w.medusa.append(MedusaShard(layers, get.f32(f"{p}.lm_head.weight")))
            if "eagle_net_config" in config:
                n_layers = config["eagle_net_config"]["num_hidden_layers"]
                for i in range(config["num_eagle_layers"]):
                    p = f"eagle_nets.{i}"
                    layers = {j: get.layer(f"{p}.drafter.layers.{j}", input_norm=j > 0) for j in range(n_layers)}
                    w.eagle.append(EagleShard(get.f32(f"{p}.drafter.vocab_embedding.weight"),
                                              get.linear(f"{p}.drafter.fc", bias=True), layers,
                                              get.f32(f"{p}.lm_head.weight")))
        return w


def _pp_first_layer(num_layers: int, pp: int, pp_rank: int) -> int:
    base, extra = divmod(num_layers, pp)
    return pp_rank * base + min(pp_rank, extra)


class _Getter:
    def __init__(self, f: Any, names: set[str], path: Path):
        self.f, self.names, self.path = f, names, path

    def raw(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise InputError(f"{self.path}: tensor {name} is missing")
        return self.f.get_tensor(name)

    def f32(self, name: str) -> torch.Tensor:
        return self.raw(name).float()

    def scalar(self, name: str) -> float | None:
        return float(self.raw(name).reshape(-1)[0]) if name in self.names else None

    def linear(self, prefix: str, bias: bool = False) -> Linear:
        w = self.raw(prefix + ".weight")
        act = None
        if w.dtype == FP8:
            w = w.float() * self.scalar(prefix + ".weights_scaling_factor")
            act = self.scalar(prefix + ".activation_scaling_factor")
            if act is None:
                raise InputError(f"{self.path}: tensor {prefix}.activation_scaling_factor is missing")
        return Linear(w.float(), act, self.f32(prefix + ".bias") if bias else None)

    def layer(self, p: str, input_norm: bool = True) -> LayerShard:
        return LayerShard(
            input_layernorm=self.f32(f"{p}.input_layernorm.weight") if input_norm else None,
            qkv=self.linear(f"{p}.attention.qkv"), dense=self.linear(f"{p}.attention.dense"),
            post_layernorm=self.f32(f"{p}.post_layernorm.weight"),
            fc=self.linear(f"{p}.mlp.fc"), gate=self.linear(f"{p}.mlp.gate"), proj=self.linear(f"{p}.mlp.proj"),
            kv_cache_scale=self.scalar(f"{p}.attention.kv_cache_scaling_factor"),
        )


def _geometry(cfg: dict[str, Any], tp: int) -> Geometry:
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_size = cfg.get("head_size") or cfg["hidden_size"] // heads
    return Geometry(heads // tp, max(kv // tp, 1), head_size, cfg["norm_epsilon"])


def _inv_freq(cfg: dict[str, Any], geo: Geometry) -> torch.Tensor:
    return rope_inv_freq(geo.head_size, float(cfg.get("rotary_base", 10000.0)), cfg.get("rotary_scaling"))


Past = list[list[KVCache]]  # [layer][tp_rank]


class ReferenceModel:
    """All ranks of a checkpoint in one process, run as the tp/pp engines would."""

    def __init__(self, config: dict[str, Any], ranks: list[RankWeights]):
        self.config = config
        self.tp = config["mapping"]["tp_size"]
        self.pp = config["mapping"]["pp_size"]
        self.ranks = ranks
        self.vocab = config["vocab_size"]
        self.geo = _geometry(config, self.tp)
        self.inv_freq = _inv_freq(config, self.geo)
        if "eagle_net_config" in config:
            net = config["eagle_net_config"]
            self.eagle_geo = _geometry(net, self.tp)
            self.eagle_inv_freq = _inv_freq(net, self.eagle_geo)

    @classmethod
    def load(cls, ckpt_dir: Path) -> ReferenceModel:
        ckpt_dir = Path(ckpt_dir)
        try:
            config = json.loads((ckpt_dir / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"{ckpt_dir / 'config.json'}: cannot read TRT-LLM config: {exc}") from None
        m = config["mapping"]
        world = m["tp_size"] * m["pp_size"]
        return cls(config, [RankWeights.load(ckpt_dir, r, config) for r in range(world)])

    def stage(self, pp_rank: int) -> list[RankWeights]:
        return [self.ranks[pp_rank * self.tp + t] for t in range(self.tp)]

    def _gather(self, x: torch.Tensor, shards: Sequence[torch.Tensor]) -> torch.Tensor:
        """Vocab-parallel projection: each rank's slice, concatenated, padding stripped."""
        return torch.cat([x @ s.T for s in shards], dim=-1)[..., : self.vocab]

    def hidden_states(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                      past: Past | None = None, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Past]:
        """Final-normed hidden states [T, H] of one sequence, and the updated KV caches."""
        past_len = 0 if not past else past[0][0].length
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + input_ids.shape[0])
        first = self.stage(0)[0]
        assert first.embedding is not None
        h = first.embedding[input_ids]
        presents: Past = []
        for pp_rank in range(self.pp):
            stage = self.stage(pp_rank)
            for layer in sorted(stage[0].layers):
                shards = [r.layers[layer] for r in stage]
                h, kv = decoder_layer(shards, h, position_ids, self.geo, self.inv_freq,
                                      None if past is None else past[layer], mask)
                presents.append(kv)
        last = self.stage(self.pp - 1)[0]
        assert last.ln_f is not None
        return rms_norm(h, last.ln_f, self.geo.eps), presents

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._gather(hidden, [r.lm_head for r in self.stage(self.pp - 1)])  # type: ignore[misc]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [T, V] (or [B, T, V] for a batch) over full sequences."""
        if input_ids.dim() == 2:
            return torch.stack([self.forward(row) for row in input_ids])
        hidden, _ = self.hidden_states(input_ids)
        return self.logits_from_hidden(hidden)

    def medusa_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[num_heads, T, V] from the base model's final-normed hidden states."""
        stage = self.stage(self.pp - 1)
        out = []
        for h in range(len(stage[0].medusa)):
            x = hidden
            for layer in range(len(stage[0].medusa[h].layers)):
                # ColumnLinear with gather_output: each rank's rows, concatenated.
                y = torch.cat([r.medusa[h].layers[layer](x) for r in stage], dim=-1)
                x = x + F.silu(y)
            out.append(self._gather(x, [r.medusa[h].lm_head for r in stage]))
        return torch.stack(out)

    def eagle_forward(self, input_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor | None = None,
                      net: int = 0, past: Past | None = None, mask: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, Past]:
        """EAGLE-1 drafter: fc(concat[embed(token); feature]) -> decoder layers (first without
        input_layernorm, no final norm) -> lm_head. ``features`` are the base model's final-normed
        hidden states. Returns (logits [T, V], drafter hidden [T, H], KV caches)."""
        stage = self.stage(0)
        nets = [r.eagle[net] for r in stage]
        past_len = 0 if not past else past[0][0].length
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + input_ids.shape[0])
        x = torch.cat((nets[0].embedding[input_ids], features), dim=-1)
        h = torch.cat([n.fc(x) for n in nets], dim=-1)
        presents: Past = []
        for j in sorted(nets[0].layers):
            h, kv = decoder_layer([n.layers[j] for n in nets], h, position_ids, self.eagle_geo, self.eagle_inv_freq,
                                  None if past is None else past[j], mask)
            presents.append(kv)
        return self._gather(h, [n.lm_head for n in nets]), h, presents


def forward_logits(ckpt_dir: Path, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits of a converted checkpoint for full sequences ([T] -> [T, V], [B, T] -> [B, T, V])."""
    with torch.no_grad():
        return ReferenceModel.load(ckpt_dir).forward(input_ids)
