"""The EAGLE-1 drafter (arXiv 2401.15077) of an engine, batched over requests.

Conventions (the converter's ``EagleForCausalLM`` checkpoint, pipeline/heads/eagle.py, the test
oracle's ``eagle_forward``): feature f_t = the base model's final hidden state AFTER the final
norm at position t; the drafter entry at position t is concat[embed(x_{t+1}), f_t] (embedding
first) -> fc (2H -> H, bias; column-parallel) -> decoder layer(s), the first without
input_layernorm -> f'_{t+1}, and lm_head(f'_{t+1}) (no final norm) predicts x_{t+2}. Attention is
the engine's own (:func:`~pipeline.runtime.model.engine.attention`), over a per-request drafter
KV cache.

The converter writes num_eagle_layers identical copies ``eagle_nets.{i}`` (TensorRT-LLM runs copy i
at draft level i); one set of weights and one cache per request are therefore the same thing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from pipeline.errors import InputError
from pipeline.runtime.model.engine import Engine, Span, decoder_layer
from pipeline.runtime.model.gemm import Gemm
from pipeline.runtime.model.kv_cache import KVCache
from pipeline.runtime.model.layers import (
    Geometry,
    LayerShard,
    prepare_linear,
    rope_inv_freq,
    rope_tables,
)


def same_weights(a: object, b: object) -> bool:
    """Whether two weight structures (dataclasses, lists, dicts of tensors and scalars) are equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        return all(same_weights(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_weights(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(same_weights(x, y) for x, y in zip(a, b))
    return a == b


@dataclass
class DraftInput:
    """New drafter entries of one request: tokens x_{t+1} paired with features f_t at positions t.
    ``visible`` [n, cache.length + n] says what each may attend to (default: the whole cache, causal
    among the new entries)."""

    cache: KVCache
    tokens: list[int]
    features: torch.Tensor  # [n, H]
    positions: list[int]
    visible: torch.Tensor | None = None


def pack(
    items: list[DraftInput], inv_freq: torch.Tensor
) -> tuple[list[Span], torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Reserve every item's new entries in its cache and pack them into one batch of T rows: each item's
    span, the token ids [T] and the rotary (cos, sin) [T, d] at their positions."""
    spans: list[Span] = []
    start = 0
    for item in items:
        item.cache.reserve(len(item.tokens))
        spans.append((start, start + len(item.tokens)))
        start += len(item.tokens)
    ids = torch.tensor([t for item in items for t in item.tokens], dtype=torch.long)
    rope = rope_tables(torch.tensor([p for item in items for p in item.positions]), inv_freq)
    return spans, ids, rope


class Drafter:
    """The EAGLE-1 drafter of an engine (eagle_nets.0 of every tp rank), batched over requests."""

    def __init__(self, engine: Engine):
        pretrained = engine.config.raw["pretrained_config"]
        net = pretrained.get("eagle_net_config")
        if not isinstance(net, dict) or not engine.ranks[0].eagle:
            raise InputError(
                f"{engine.config.folder}: no eagle_net_config / eagle_nets.* tensors; rebuild the EAGLE engine"
            )
        if engine.pp != 1:
            raise InputError("EAGLE needs pp=1 (TensorRT-LLM: pipeline parallelism is not supported in EAGLE)")
        tp, hidden = engine.tp, engine.config.model.hidden_size
        heads = int(net["num_attention_heads"])
        head_size = int(net.get("head_size") or hidden // heads)
        self.geo = Geometry(
            heads // tp,
            max(int(net.get("num_key_value_heads") or heads) // tp, 1),
            head_size,
            float(net.get("norm_epsilon", 1e-5)),
        )
        self.inv_freq = rope_inv_freq(head_size, float(net.get("rotary_base", 10000.0)), net.get("rotary_scaling"))
        for rank in engine.ranks:
            # TensorRT-LLM runs copy i at draft level i; the converter writes identical copies and this
            # drafter runs copy 0 at every level, so a checkpoint whose trained parts differ is refused.
            # (Comparing the copies' embeddings and lm_heads too would page in hundreds of MB of an
            # untouched float32 file; EAGLE-1 copies them all from the base model.)
            if not all(
                same_weights((net.fc, net.layers), (rank.eagle[0].fc, rank.eagle[0].layers)) for net in rank.eagle[1:]
            ):
                raise InputError(
                    f"{engine.config.folder}: rank {rank.rank}'s eagle_nets.* copies differ; the "
                    "reference backend runs one drafter at every level (convert with specdeploy)"
                )
            del rank.eagle[1:]  # bf16 engines hold each copy widened to float32: ~230 MB for SmolLM2
        nets = [rank.eagle[0] for rank in engine.ranks]
        self.embedding = nets[0].embedding  # replicated on every rank
        self.fc = [prepare_linear(n.fc, engine.bf16) for n in nets]
        self.layers: list[list[LayerShard]] = [[n.layers[j] for n in nets] for j in sorted(nets[0].layers)]
        for layer in self.layers:
            for shard in layer:
                engine.prepare_linears(shard)
        # The drafter's lm_head is the base one in every EAGLE-1 checkpoint we know; share it then.
        shared = engine.adopt_lm_head([[net] for net in nets])
        self.lm_heads = engine.lm_heads if shared else [Gemm(n.lm_head, bf16=engine.bf16) for n in nets]
        self.engine = engine
        self.tp = tp

    def new_cache(self, limit: int) -> KVCache:
        return KVCache([self.geo.kv_heads] * self.tp, len(self.layers), self.geo.head_size, torch.float32, limit)

    @torch.no_grad()
    def forward(self, items: list[DraftInput]) -> list[torch.Tensor]:
        """Append every item's entries to its cache; returns each item's outputs f' [n, H]."""
        spans, ids, rope = pack(items, self.inv_freq)
        x = torch.cat((self.embedding[ids], torch.cat([item.features for item in items])), dim=-1)
        h = torch.cat([fc(x) for fc in self.fc], dim=-1)  # column-parallel fc, gathered
        caches = [item.cache for item in items]
        # What each new entry may attend to: the item's own mask, or the whole cache and causal
        # among the new entries.
        masks = [
            item.visible
            if item.visible is not None
            else torch.ones(len(item.tokens), item.cache.length + len(item.tokens), dtype=torch.bool).tril(
                item.cache.length
            )
            for item in items
        ]
        for j, shards in enumerate(self.layers):  # the first has no input_layernorm
            h = decoder_layer(shards, h, rope, self.geo, caches, spans, masks, j)
        for item in items:
            item.cache.advance(len(item.tokens))
        return [h[a:b] for a, b in spans]

    def candidates(self, h: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k most likely next tokens [R, k], best first, and their drafter log-probabilities
        [R, k], from outputs f' [R, H] (vocab-parallel lm_head). Only the k picked log-probabilities
        are computed (logit - logsumexp), not a log_softmax over the whole vocabulary per row."""
        logits = self.engine.lm_head(h, self.lm_heads)
        top = logits.topk(k, dim=-1)
        return top.indices, top.values - torch.logsumexp(logits, dim=-1, keepdim=True)
