"""The test oracle: a plain-PyTorch forward over a TRT-LLM checkpoint folder, computed rank by rank.

This is what proves a conversion exact: each tp rank multiplies only its own shards
(column-parallel qkv/fc/gate, row-parallel dense/proj partial sums), the partial sums are
all-reduced (summed) across the tp ranks of a stage, pipeline stages run their layers in
order, and vocab-parallel outputs are gathered and stripped of padding. FP8 checkpoints run as
the engine would (pipeline.runtime.model.weights dequantizes at load; layers fake-quantizes).

It shares the layer math (norms, rope, the gated MLP, FP8 linears) and the rank-file loader with
the reference engine, but not the attention: here attention is written out (explicit scores,
softmax, a bool mask), so an error in the engine's fused attention or KV cache cannot hide.

* ``attention(shard, x, position_ids, geo, inv_freq, past=None, mask=None) -> (partial, (k, v))``:
  ``x`` [T, H] is the normed input, ``position_ids`` [T] absolute positions, ``past`` the rank's
  cached (k, v) (already rotated), ``mask`` an optional bool [T, past+T] (True = may attend;
  default causal). The returned partial must be summed over tp ranks.
* ``decoder_layer(shards, h, ...)`` does attention and MLP with the residuals and the all-reduce.
* ``ReferenceModel.hidden_states(ids, position_ids, past, mask)`` returns the final-normed hidden
  states and the new per-layer, per-rank (k, v) pairs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.errors import InputError
from pipeline.runtime.model.layers import (
    Geometry,
    LayerShard,
    all_reduce,
    apply_rope,
    fake_quant_fp8,
    mlp,
    rms_norm,
    rope_inv_freq,
)
from pipeline.runtime.model.weights import RankWeights

PastKV = tuple[torch.Tensor, torch.Tensor]  # one rank's (k, v) [kv_heads, T, d], rotated (FP8: fake-quantized)


def causal_mask(q_len: int, past_len: int) -> torch.Tensor:
    keys = torch.arange(past_len + q_len)
    return keys[None, :] <= (past_len + torch.arange(q_len))[:, None]


def attention(
    w: LayerShard,
    x: torch.Tensor,
    position_ids: torch.Tensor,
    geo: Geometry,
    inv_freq: torch.Tensor,
    past: PastKV | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, PastKV]:
    T, d = x.shape[0], geo.head_size
    qkv = w.qkv(x)
    q, k, v = qkv.split([geo.heads * d, geo.kv_heads * d, geo.kv_heads * d], dim=-1)
    q = apply_rope(q.view(T, geo.heads, d).transpose(0, 1), position_ids, inv_freq)
    k = apply_rope(k.view(T, geo.kv_heads, d).transpose(0, 1), position_ids, inv_freq)
    v = v.view(T, geo.kv_heads, d).transpose(0, 1)
    if w.kv_cache_scale is not None:
        k, v = fake_quant_fp8(k, w.kv_cache_scale), fake_quant_fp8(v, w.kv_cache_scale)
    past_len = 0 if past is None else past[0].shape[1]
    if past is not None:
        k, v = torch.cat((past[0], k), dim=1), torch.cat((past[1], v), dim=1)
    group = geo.heads // geo.kv_heads
    scores = q @ k.repeat_interleave(group, dim=0).transpose(1, 2) / math.sqrt(d)
    allowed = causal_mask(T, past_len) if mask is None else mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    ctx = torch.softmax(scores, dim=-1) @ v.repeat_interleave(group, dim=0)
    return w.dense(ctx.transpose(0, 1).reshape(T, geo.heads * d)), (k, v)


def decoder_layer(
    shards: Sequence[LayerShard],
    h: torch.Tensor,
    position_ids: torch.Tensor,
    geo: Geometry,
    inv_freq: torch.Tensor,
    past: Sequence[PastKV] | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[PastKV]]:
    """Residual + all-reduced attention, residual + all-reduced MLP, over the tp shards of one layer."""
    norm_in = shards[0].input_layernorm
    x = rms_norm(h, norm_in, geo.eps) if norm_in is not None else h
    partials, caches = [], []
    for r, w in enumerate(shards):
        p, kv = attention(w, x, position_ids, geo, inv_freq, None if past is None else past[r], mask)
        partials.append(p)
        caches.append(kv)
    h = h + all_reduce(partials)
    x = rms_norm(h, shards[0].post_layernorm, geo.eps)
    h = h + all_reduce([mlp(w, x) for w in shards])
    return h, caches


def _geometry(cfg: dict[str, Any], tp: int) -> Geometry:
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_size = cfg.get("head_size") or cfg["hidden_size"] // heads
    return Geometry(heads // tp, max(kv // tp, 1), head_size, cfg["norm_epsilon"])


def _inv_freq(cfg: dict[str, Any], geo: Geometry) -> torch.Tensor:
    return rope_inv_freq(geo.head_size, float(cfg.get("rotary_base", 10000.0)), cfg.get("rotary_scaling"))


Past = list[list[PastKV]]  # [layer][tp_rank]


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

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past: Past | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Past]:
        """Final-normed hidden states [T, H] of one sequence, and the updated KV caches."""
        past_len = 0 if not past else past[0][0][0].shape[1]
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
                h, kv = decoder_layer(
                    shards, h, position_ids, self.geo, self.inv_freq, None if past is None else past[layer], mask
                )
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

    def eagle_forward(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        net: int = 0,
        past: Past | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, Past]:
        """EAGLE-1 drafter: fc(concat[embed(token); feature]) -> decoder layers (first without
        input_layernorm, no final norm) -> lm_head. ``features`` are the base model's final-normed
        hidden states. Returns (logits [T, V], drafter hidden [T, H], KV caches)."""
        stage = self.stage(0)
        nets = [r.eagle[net] for r in stage]
        past_len = 0 if not past else past[0][0][0].shape[1]
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + input_ids.shape[0])
        x = torch.cat((nets[0].embedding[input_ids], features), dim=-1)
        h = torch.cat([n.fc(x) for n in nets], dim=-1)
        presents: Past = []
        for j in sorted(nets[0].layers):
            h, kv = decoder_layer(
                [n.layers[j] for n in nets],
                h,
                position_ids,
                self.eagle_geo,
                self.eagle_inv_freq,
                None if past is None else past[j],
                mask,
            )
            presents.append(kv)
        return self._gather(h, [n.lm_head for n in nets]), h, presents


def forward_logits(ckpt_dir: Path, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits of a converted checkpoint for full sequences ([T] -> [T, V], [B, T] -> [B, T, V])."""
    with torch.no_grad():
        return ReferenceModel.load(ckpt_dir).forward(input_ids)
