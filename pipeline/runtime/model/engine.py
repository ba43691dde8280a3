"""The reference engine: all tp/pp ranks of an engine folder in one process, batched over requests.

Layer math comes from ``layers`` (rms_norm, rope, FP8 linears, the gated MLP), the per-rank
weights from ``weights`` (FP8 dequantized at load); this module adds what serving needs on top:

* one step runs several requests with different past lengths: every linear (qkv, dense,
  fc/gate/proj, lm_head) is one matmul over all requests' new tokens; only attention runs
  per request, over that request's own cache (KVCache in kv_cache.py);
* tensor parallelism is computed rank by rank: column-parallel qkv/fc/gate shards, row-parallel
  dense/proj partial sums, then an all-reduce (a sum in rank order); pipeline stages run in order;
* logits are computed only for the rows a caller asks for (the last token of a prompt, every
  token of a speculative tree), since the lm_head is the largest matmul of a small model;
* weight matmuls run in the engine's dtype (gemm.py): float32, or bf16 GEMMs for bfloat16
  engines; rope angles and attention masks are computed once per step, not once per layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.errors import InputError
from pipeline.lora.rules import MODULE_IDS
from pipeline.runtime.model.config import EngineConfig, load_engine_config
from pipeline.runtime.model.gemm import Gemm
from pipeline.runtime.model.kv_cache import KVCache
from pipeline.runtime.model.layers import (
    Geometry,
    LayerShard,
    all_reduce,
    fake_quant_fp8,
    mlp,
    prepare_linear,
    rms_norm,
    rope_inv_freq,
    rope_tables,
    rotate,
)
from pipeline.runtime.model.lora import LoraSettings, LoraStep, LoraWeights
from pipeline.runtime.model.weights import RankWeights


class Logits(Enum):
    NONE = "none"  # a prompt chunk that is not the last one
    LAST = "last"  # the next token after these tokens
    ALL = "all"  # one row per new token (speculative verification)


@dataclass
class StepInput:
    """New tokens of one request for one forward step.

    ``positions`` default to ``cache.length + arange(n)``; tree verification passes depth-based
    positions. ``mask`` [n, n] says which new tokens each new token may attend to (default
    causal); every cached token is always visible. ``all_hidden``: return the hidden state of
    every new token, whatever rows get logits (EAGLE's drafter reads the whole prompt, and logits
    for all of it would cost an lm_head pass per prompt token). ``capture_layers``: return, for the
    same rows as the hidden states, the outputs of these decoder layers (0-based, before the final
    norm), concatenated in this order (EAGLE-3's drafter fuses them).
    """

    cache: KVCache
    token_ids: list[int]
    logits: Logits = Logits.LAST
    positions: list[int] | None = None
    mask: torch.Tensor | None = None
    all_hidden: bool = False
    lora: LoraWeights | None = None  # the request's adapter (lora_task_id); None: the base model
    capture_layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepRows:
    """One item's output rows: logits [rows, vocab] (float32) and the final-normed hidden states
    [rows, hidden] they came from (Medusa heads and EAGLE drafters read the latter); ``captured``
    [rows, k * hidden] the outputs of the item's k ``capture_layers`` at those rows (else None)."""

    logits: torch.Tensor
    hidden: torch.Tensor
    captured: torch.Tensor | None = None


Span = tuple[int, int]  # an item's rows [a, b) in a step's packed rows


def decoder_layer(
    shards: Sequence[LayerShard],
    h: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    geo: Geometry,
    caches: Sequence[KVCache],
    spans: Sequence[Span],
    masks: Sequence[torch.Tensor | None],
    layer: int,
    lora: LoraStep | None = None,
) -> torch.Tensor:
    """One decoder layer over the tp shards (the engine's and the EAGLE drafter's): residual +
    all-reduced attention, residual + all-reduced MLP. ``h`` [T, H] is every request's new rows;
    a shard without input_layernorm (EAGLE's first drafter layer) feeds attention ``h`` itself.
    ``lora``: the step's adapters, added unmerged to each projection (tp 1 only)."""
    norm = shards[0].input_layernorm
    x = h if norm is None else rms_norm(h, norm, geo.eps)
    h = h + all_reduce([attention(w, x, rope, geo, caches, spans, masks, t, layer, lora) for t, w in enumerate(shards)])
    x = rms_norm(h, shards[0].post_layernorm, geo.eps)
    if lora is not None:
        return h + _lora_mlp(shards[0], x, lora, layer)
    return h + all_reduce([mlp(w, x) for w in shards])


# TensorRT-LLM's LoRA module id of each projection.
_QKV, _Q, _K, _V = (MODULE_IDS[m] for m in ("attn_qkv", "attn_q", "attn_k", "attn_v"))
_DENSE, _H_TO_4H, _4H_TO_H, _GATE = (MODULE_IDS[m] for m in ("attn_dense", "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate"))


def _lora_mlp(w: LayerShard, x: torch.Tensor, lora: LoraStep, layer: int) -> torch.Tensor:
    """The gated MLP with each row's adapter: fc is mlp_h_to_4h (HF gate_proj), gate is mlp_gate
    (HF up_proj), proj is mlp_4h_to_h (HF down_proj)."""
    fc = lora.add(w.fc(x), layer, _H_TO_4H, x)
    gate = lora.add(w.gate(x), layer, _GATE, x)
    inner = F.silu(fc) * gate
    return lora.add(w.proj(inner), layer, _4H_TO_H, inner)


def _lora_qkv(qkv: torch.Tensor, x: torch.Tensor, geo: Geometry, lora: LoraStep, layer: int) -> torch.Tensor:
    """The fused qkv projection's output with each row's adapter: the fused module's update, then
    the q, k and v modules' updates on their columns."""
    q, kv = geo.heads * geo.head_size, geo.kv_heads * geo.head_size
    lora.add(qkv, layer, _QKV, x)
    for part, module in zip(qkv.split([q, kv, kv], dim=-1), (_Q, _K, _V)):
        lora.add(part, layer, module, x)  # a view: the update lands in qkv's columns
    return qkv


def attention(
    w: LayerShard,
    x: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    geo: Geometry,
    caches: Sequence[KVCache],
    spans: Sequence[Span],
    masks: Sequence[torch.Tensor | None],
    tp_rank: int,
    layer: int,
    lora: LoraStep | None = None,
) -> torch.Tensor:
    """One rank's attention partial sum over a batch of requests (the engine's and the EAGLE
    drafter's): q/k/v and the output projection run once over every request's new rows; attention
    runs per request over its own cache, which gets the new K/V.

    ``x`` [T, H] normed input of all requests' new rows; ``spans[i]`` request i's rows;
    ``masks[i]`` None (its rows see the whole cache, causal among themselves; only for one row) or
    [n_i, cache_i + n_i], additive float or bool.
    """
    T, d = x.shape[0], geo.head_size
    qkv = w.qkv(x) if lora is None else _lora_qkv(w.qkv(x), x, geo, lora, layer)
    q, k, v = qkv.split([geo.heads * d, geo.kv_heads * d, geo.kv_heads * d], dim=-1)
    q = rotate(q.view(T, geo.heads, d).transpose(0, 1), *rope)  # [heads, T, d]
    k = rotate(k.view(T, geo.kv_heads, d).transpose(0, 1), *rope)  # [kv_heads, T, d]
    v = v.view(T, geo.kv_heads, d).transpose(0, 1)
    if w.kv_cache_scale is not None:  # FP8 KV cache: what is stored is what the kernel reads back
        k, v = fake_quant_fp8(k, w.kv_cache_scale), fake_quant_fp8(v, w.kv_cache_scale)
    ctx = torch.empty(T, geo.heads, d)
    for cache, (a, b), mask in zip(caches, spans, masks):
        keys, values = cache.write(tp_rank, layer, k[:, a:b], v[:, a:b])
        out = F.scaled_dot_product_attention(q[None, :, a:b], keys[None], values[None], attn_mask=mask, enable_gqa=True)
        ctx[a:b] = out[0].transpose(0, 1)
    flat = ctx.view(T, geo.heads * d)
    out = w.dense(flat)
    return out if lora is None else lora.add(out, layer, _DENSE, flat)


class Engine:
    def __init__(self, config: EngineConfig, ranks: list[RankWeights]):
        self.config = config
        # what applies a step's adapters (a probe of their CPU cost swaps in one that times them)
        self.lora_step: Callable[[list[LoraWeights | None], list[Span]], LoraStep] = LoraStep
        shape = config.model
        self.tp, self.pp = config.parallel.tp, config.parallel.pp
        self.ranks = ranks  # by rank = pp_rank * tp + tp_rank
        self.geo = Geometry(
            shape.num_heads // self.tp, max(shape.num_kv_heads // self.tp, 1), shape.head_dim, shape.norm_epsilon
        )
        first, last = self.stage(0)[0], self.stage(self.pp - 1)
        lm_heads = [r.lm_head for r in last if r.lm_head is not None]
        if first.embedding is None or last[0].ln_f is None or len(lm_heads) != self.tp:
            raise InputError(
                f"{config.folder}: rank files lack the embedding (first stage) or ln_f/lm_head "
                "(last stage); rebuild the engine"
            )
        self.embedding: torch.Tensor = first.embedding
        self.device = self.embedding.device  # every weight, the KV caches and each step's tensors live here
        self.inv_freq = rope_inv_freq(shape.head_dim, shape.rope_theta, shape.rope_scaling).to(self.device)
        self.ln_f: torch.Tensor = last[0].ln_f
        self.bf16 = config.dtype == "bfloat16"
        self.lm_head_weights = lm_heads  # [tp_rank]: the vocab-parallel lm_head's rows
        self.lm_heads = [Gemm(weight, bf16=self.bf16) for weight in lm_heads]
        for rank in ranks:
            for shard in rank.layers.values():
                self.prepare_linears(shard)
        self.layer_ids = [sorted(self.stage(p)[0].layers) for p in range(self.pp)]
        self.lora = LoraSettings.from_build_config(
            config.raw["build_config"], f"{config.folder / 'config.json'} build_config"
        )
        if self.lora is not None and self.tp > 1:
            raise InputError(
                f"{config.folder}: the reference backend applies LoRA with tp 1 only (this engine has tp {self.tp}); "
                "build the LoRA group with parallel.tp: 1 for the CPU reference"
            )
        if sum(len(ids) for ids in self.layer_ids) != shape.num_layers:
            raise InputError(
                f"{config.folder}: rank files hold {sum(len(i) for i in self.layer_ids)} decoder "
                f"layers, config.json says {shape.num_layers}; rebuild the engine"
            )

    def prepare_linears(self, shard: LayerShard) -> None:
        """Replace a decoder layer's linears by their engine form (gemm.py), in place."""
        for name in ("qkv", "dense", "fc", "gate", "proj"):
            setattr(shard, name, prepare_linear(getattr(shard, name), self.bf16))

    def adopt_lm_head(self, holders: Sequence[Sequence[Any]]) -> bool:
        """Whether every holder has the last stage's lm_head (``holders[tp_rank]``: objects with an
        ``lm_head`` tensor, e.g. Medusa heads); then they get the engine's tensor, so their copies are
        freed, and :meth:`lm_head` with the engine's own GEMMs serves them."""
        weights = self.lm_head_weights
        if not all(torch.equal(h.lm_head, weight) for hs, weight in zip(holders, weights) for h in hs):
            return False
        for hs, weight in zip(holders, weights):
            for h in hs:
                h.lm_head = weight
        return True

    def lm_head(self, hidden: torch.Tensor, heads: Sequence[Gemm] | None = None) -> torch.Tensor:
        """Logits [R, vocab] from final hidden states: the vocab-parallel lm_head (each rank's rows of
        the vocabulary, concatenated, padding dropped)."""
        heads = self.lm_heads if heads is None else heads
        logits = heads[0](hidden) if len(heads) == 1 else torch.cat([head(hidden) for head in heads], dim=-1)
        vocab = self.config.model.vocab_size
        return logits if logits.shape[1] == vocab else logits[:, :vocab]

    @classmethod
    def load(cls, folder: Path, device: str = "cpu") -> Engine:
        """``device`` "cuda" puts the weights, KV caches and step tensors on the GPU (run the decoding
        methods inside ``torch.device(engine.device)`` too, so their masks and indices are made there)."""
        config = load_engine_config(folder)
        pretrained = config.raw["pretrained_config"]
        if pretrained.get("use_parallel_embedding"):
            raise InputError(
                f"{config.folder / 'config.json'}: use_parallel_embedding=true is not supported by "
                "the reference backend; convert without it"
            )
        ranks = [RankWeights.load(config.folder, r, pretrained, device) for r in range(config.parallel.world_size)]
        return cls(config, ranks)

    def stage(self, pp_rank: int) -> list[RankWeights]:
        return self.ranks[pp_rank * self.tp : (pp_rank + 1) * self.tp]

    def new_cache(self, limit: int) -> KVCache:
        """An empty cache for one request that will never hold more than ``limit`` tokens."""
        return KVCache(
            [self.geo.kv_heads] * self.tp,
            self.config.model.num_layers,
            self.geo.head_size,
            torch.float32,
            limit,
            tokens_per_block=self.config.limits.tokens_per_block,
        )

    @torch.no_grad()
    def forward(self, items: Sequence[StepInput]) -> list[StepRows]:
        """Run one step; returns per item 0, 1 or n rows of logits, as ``item.logits`` asks.

        Each item's tokens are appended to its cache (``cache.length`` grows by n).
        """
        if self.device.type == "cpu":  # the default device: no torch-function mode in the way of every op
            return self._forward(items)
        with torch.device(self.device):  # new tensors (positions, masks, KV cache growth) on the engine's device
            return self._forward(items)

    def _forward(self, items: Sequence[StepInput]) -> list[StepRows]:
        spans: list[Span] = []
        positions, start = [], 0
        for item in items:
            n = len(item.token_ids)
            item.cache.reserve(n)
            past = item.cache.length
            positions.append(torch.arange(past, past + n) if item.positions is None else torch.tensor(item.positions))
            spans.append((start, start + n))
            start += n
        ids = torch.tensor([t for item in items for t in item.token_ids], dtype=torch.long)
        rope = rope_tables(torch.cat(positions), self.inv_freq)
        masks = [_mask(item, len(item.token_ids), item.cache.length + len(item.token_ids)) for item in items]
        caches = [item.cache for item in items]
        lora = self.lora_step([item.lora for item in items], spans) if any(item.lora for item in items) else None
        if lora is not None and self.lora is None:
            raise InputError("a request carries a LoRA adapter, but the engine was built without the LoRA plugin")
        h = self.embedding[ids]
        capture = {layer for item in items for layer in item.capture_layers}
        captured: dict[int, torch.Tensor] = {}  # layer -> its output [T, H] (decoder_layer makes a new tensor)
        for pp_rank, layer_ids in enumerate(self.layer_ids):
            stage = self.stage(pp_rank)
            for layer in layer_ids:
                shards = [r.layers[layer] for r in stage]
                h = decoder_layer(shards, h, rope, self.geo, caches, spans, masks, layer, lora)
                if layer in capture:
                    captured[layer] = h
        for item in items:
            item.cache.advance(len(item.token_ids))
        return self._logits(h, items, spans, captured)

    def _logits(
        self,
        h: torch.Tensor,
        items: Sequence[StepInput],
        spans: list[tuple[int, int]],
        captured: dict[int, torch.Tensor] | None = None,
    ) -> list[StepRows]:
        hidden_rows: list[int] = []
        logit_rows: list[int] = []  # indices into hidden_rows
        hidden_counts, logit_counts = [], []
        for item, (a, b) in zip(items, spans):
            wanted = {Logits.NONE: [], Logits.LAST: [b - 1], Logits.ALL: list(range(a, b))}[item.logits]
            kept = list(range(a, b)) if item.all_hidden else wanted
            logit_rows += [len(hidden_rows) + kept.index(row) for row in wanted]
            hidden_rows += kept
            hidden_counts.append(len(kept))
            logit_counts.append(len(wanted))
        hidden = rms_norm(h[hidden_rows], self.ln_f, self.geo.eps)
        logits = self.lm_head(hidden[logit_rows]) if logit_rows else torch.empty(0, self.config.model.vocab_size)
        out = [StepRows(lg, hd) for lg, hd in zip(logits.split(logit_counts), hidden.split(hidden_counts))]
        if not captured:
            return out
        rows = torch.tensor(hidden_rows, dtype=torch.long).split(hidden_counts)
        return [
            dataclasses.replace(r, captured=torch.cat([captured[layer][i] for layer in item.capture_layers], dim=-1))
            if item.capture_layers
            else r
            for r, item, i in zip(out, items, rows)
        ]


def _mask(item: StepInput, n: int, total: int) -> torch.Tensor | None:
    """Additive float [n, total] (0 = may attend, -inf = may not): the whole cache, plus causal or tree
    order among new tokens. Float, not bool, because attention would convert a bool mask again in
    every layer (~4% of a 16-row tree step on SmolLM2, bf16)."""
    if n == 1 and item.mask is None:
        return None  # a single new token sees everything before it
    mask = torch.zeros(n, total)
    among = (
        item.mask.to(device=mask.device, dtype=torch.bool)
        if item.mask is not None
        else torch.ones(n, n, dtype=torch.bool).tril()
    )
    mask[:, total - n :].masked_fill_(~among, float("-inf"))
    return mask
