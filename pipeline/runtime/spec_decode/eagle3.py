"""EAGLE-3 (Li et al., arXiv 2503.01840): a one-layer drafter over the target's fused low/middle/high
hidden states, drafting a chain of K tokens per step, or TensorRT-LLM's dynamic tree K levels deep,
verified by the target in one pass.

What the drafter computes, as TensorRT-LLM's PyTorch backend serves a ModelOpt export
(tensorrt_llm/_torch/models/modeling_speculative.py: ``Eagle3DecoderLayer``, ``Eagle3DraftModel``,
``Eagle3ForCausalLM.apply_eagle3_fc``; ModelOpt 0.47 modelopt/torch/speculative/plugins/
modeling_eagle.py ``EagleModule`` and hf_eagle.py ``HFEagleModel``):

* the target's pass captures the OUTPUT of decoder layer l (0-based, before the final norm) for each
  capture layer l (ModelOpt: a forward hook on ``base_model.layers[l]``; TensorRT-LLM:
  ``maybe_capture_hidden_states(layer_idx, hidden, residual)`` after layer l), concatenated in layer
  order [rows, k * H_target]; ``fc`` fuses them to g_t [rows, H] (no fc for one captured layer);
* the drafter entry at position t is the token x_{t+1} paired with a hidden state: g_t, the fused
  target state, for committed tokens; the drafter's own pre-norm output for a drafted one;
* its first layer attends over [input_layernorm(embed(x_{t+1})); hidden_norm(hidden)] (2H wide
  q/k/v), with the hidden state (not the concatenation) as the residual; then post_attention_layernorm
  and the gated MLP, as a Llama layer; rope at position t over its own KV cache; later layers
  (if any) read hidden_norm(hidden) alone;
* the layer's output o_t (pre-norm) is fed back as the next entry's hidden state; lm_head(norm(o_t))
  over the draft vocabulary predicts x_{t+2}; draft id i is target id i + d2t[i].

ModelOpt 0.47's training forward differs from TensorRT-LLM in one place: its hook normalises the
hidden half after the decoder layer's own ``input_layernorm`` (hidden_norm(input_layernorm(g))), while
TensorRT-LLM serves hidden_norm(g). This drafter follows TensorRT-LLM, the serving side; the two agree
while input_layernorm's weight is all ones (a fresh ModelOpt drafter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file

from pipeline.errors import InputError
from pipeline.io.files import read_json
from pipeline.methods.eagle3 import Eagle3Config, tree_problem
from pipeline.methods.eagle3_reader import Eagle3Layout, read_eagle3
from pipeline.runtime.model.engine import Engine, StepInput, StepRows, attention
from pipeline.runtime.model.gemm import Gemm
from pipeline.runtime.model.kv_cache import KVCache
from pipeline.runtime.model.layers import Geometry, LayerShard, Linear, mlp, rms_norm, rope_inv_freq
from pipeline.runtime.spec_decode.base import Accepted, DecodingMethod, Sequence
from pipeline.runtime.spec_decode.eagle.drafter import DraftInput, pack
from pipeline.runtime.spec_decode.eagle.trees import Candidates, Draft, DynamicTree
from pipeline.runtime.spec_decode.registry import Candidate, Measuring, MethodSettings, register
from pipeline.runtime.spec_decode.tree_verify import Proposal, verify


def draft_to_target(draft_ids: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
    """Target ids of draft-vocabulary ids [R]: i + d2t[i] (ModelOpt ``pseudo_speculative_generate``,
    TensorRT-LLM ``d2t``); the ids themselves without a d2t.

        >>> draft_to_target(torch.tensor([0, 2]), torch.tensor([5, 5, 7])).tolist()
        [5, 9]
    """
    return draft_ids if d2t is None else draft_ids + d2t[draft_ids]


@dataclass
class _Layer:
    shard: LayerShard  # qkv reads 2H for a wide layer; input_layernorm normalises the embedding then
    hidden_norm: torch.Tensor  # [H]
    wide: bool  # reads [input_layernorm(embedding); hidden_norm(hidden)]


def _canonical(name: str) -> str:
    """The EAGLE authors' ``midlayer.X`` / ``midlayer.N.X`` as ``layers.0.X`` / ``layers.N.X``."""
    match = re.match(r"^midlayer\.(?:(\d+)\.)?(.*)$", name)
    return name if match is None else f"layers.{match.group(1) or 0}.{match.group(2)}"


class Eagle3Drafter:
    """An EAGLE-3 drafter folder (read and checked by eagle3_reader first) for ``engine``, batched over
    requests: :meth:`fuse` the captured target states, :meth:`forward` entries through the decoder
    layer(s) into each request's drafter KV cache, :meth:`logits` / :meth:`draft` the next tokens."""

    def __init__(self, engine: Engine, folder: Path):
        folder = Path(folder)
        layout: Eagle3Layout = read_eagle3(folder, engine.config.model)
        config: dict[str, Any] = read_json(folder / "config.json", "EAGLE-3 drafter config")
        tensors: dict[str, torch.Tensor] = {}
        for name in layout.weights:
            for key, value in load_file(str(folder / name)).items():
                tensors[_canonical(key)] = value
        bf16 = engine.bf16

        def weight(name: str) -> torch.Tensor:
            return tensors[name].to(torch.float32)

        def linear(name: str) -> Gemm:
            bias = tensors.get(f"{name}.bias")
            return Gemm(weight(f"{name}.weight"), None if bias is None else bias.float(), bf16)

        self.layout = layout
        self.capture_layers = layout.capture_layers
        self.eps = float(config.get("rms_norm_eps") or 1e-6)
        self.geo = Geometry(layout.num_heads, layout.num_kv_heads, layout.head_dim, self.eps)
        rope_scaling = config.get("rope_scaling") or None
        theta = config.get("rope_theta") or (rope_scaling or {}).get("rope_theta") or 10000.0
        self.inv_freq = rope_inv_freq(layout.head_dim, float(theta), rope_scaling).to(engine.device)
        self.fc = linear("fc") if "fc.weight" in tensors else None  # TensorRT-LLM: no fc for one layer
        regular = bool((config.get("eagle_config") or {}).get("next_layer_regular", True))
        self.layers: list[_Layer] = []
        for i in range(layout.num_layers):
            p = f"layers.{i}."
            wide = i == 0 or not regular
            q, k, v = (weight(f"{p}self_attn.{n}_proj.weight") for n in "qkv")
            qkv_bias = None
            if f"{p}self_attn.q_proj.bias" in tensors:
                qkv_bias = torch.cat([tensors[f"{p}self_attn.{n}_proj.bias"].float() for n in "qkv"])
            shard = LayerShard(
                input_layernorm=weight(f"{p}input_layernorm.weight") if wide else None,
                qkv=Linear(torch.cat([q, k, v]), bias=qkv_bias),
                dense=Linear(weight(f"{p}self_attn.o_proj.weight"), bias=_opt(tensors, f"{p}self_attn.o_proj.bias")),
                post_layernorm=weight(f"{p}post_attention_layernorm.weight"),
                fc=Linear(weight(f"{p}mlp.gate_proj.weight"), bias=_opt(tensors, f"{p}mlp.gate_proj.bias")),
                gate=Linear(weight(f"{p}mlp.up_proj.weight"), bias=_opt(tensors, f"{p}mlp.up_proj.bias")),
                proj=Linear(weight(f"{p}mlp.down_proj.weight"), bias=_opt(tensors, f"{p}mlp.down_proj.bias")),
            )
            engine.prepare_linears(shard)
            self.layers.append(_Layer(shard, weight(f"{p}hidden_norm.weight"), wide))
        self.norm = weight("norm.weight")
        # TensorRT-LLM shares the target's embedding unless the drafter's width differs from it.
        own_embedding = layout.target_hidden_size != layout.hidden_size
        self.embedding = weight("embed_tokens.weight") if own_embedding else engine.embedding
        self.d2t = tensors["d2t"].to(torch.long) if layout.has_d2t else None
        # The drafter's lm_head, or the target's when absent; an exported copy of the target's is shared.
        head = tensors.get("lm_head.weight")
        target_heads = engine.lm_head_weights
        if head is None or (len(target_heads) == 1 and torch.equal(head.float(), target_heads[0])):
            self.lm_head = engine.lm_heads[0]
        else:
            self.lm_head = Gemm(head.float(), None, bf16)
        self.engine = engine

    def new_cache(self, limit: int) -> KVCache:
        return KVCache([self.geo.kv_heads], len(self.layers), self.geo.head_size, torch.float32, limit)

    def fuse(self, captured: torch.Tensor) -> torch.Tensor:
        """g [rows, H] from the target's captured layer outputs [rows, k * H_target]."""
        return captured if self.fc is None else self.fc(captured)

    @torch.no_grad()
    def forward(self, items: list[DraftInput]) -> list[torch.Tensor]:
        """Append every item's entries (tokens x_{t+1}, hidden states [n, H], positions t) to its cache;
        returns each item's pre-norm outputs o [n, H] (fed back as the next entry's hidden state). Each
        entry sees what the item's ``visible`` says (a tree node: the committed entries, its ancestors,
        itself), else the whole cache and the item's earlier entries."""
        spans, ids, rope = pack(items, self.inv_freq)
        embeds = self.embedding[ids]  # [T, H]
        h = torch.cat([item.features for item in items])  # [T, H]
        caches = [item.cache for item in items]
        masks: list[torch.Tensor | None] = []
        for item in items:
            n, past = len(item.tokens), item.cache.length
            if item.visible is not None:  # tree nodes: the committed entries, their ancestors, themselves
                masks.append(item.visible)  # [n, past + n]
            elif n == 1:
                masks.append(None)  # the whole cache
            else:
                masks.append(torch.ones(n, past + n, dtype=torch.bool).tril(past))  # [n, past + n], causal
        for j, layer in enumerate(self.layers):
            w = layer.shard
            x = rms_norm(h, layer.hidden_norm, self.eps)
            if layer.wide:
                assert w.input_layernorm is not None
                x = torch.cat((rms_norm(embeds, w.input_layernorm, self.eps), x), dim=-1)  # [T, 2H]
            h = h + attention(w, x, rope, self.geo, caches, spans, masks, 0, j)
            h = h + mlp(w, rms_norm(h, w.post_layernorm, self.eps))
        for item in items:
            item.cache.advance(len(item.tokens))
        return [h[a:b] for a, b in spans]

    def logits(self, outputs: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [R, draft_vocab] of pre-norm outputs [R, H]."""
        logits = self.lm_head(rms_norm(outputs, self.norm, self.eps))
        return logits[:, : self.layout.draft_vocab_size]

    def draft(self, outputs: torch.Tensor) -> list[int]:
        """The greedy draft token (a target id) after each pre-norm output [R, H]."""
        return draft_to_target(self.logits(outputs).argmax(dim=-1), self.d2t).tolist()

    def candidates(self, outputs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k most likely next tokens (target ids) [R, k], best first, and their draft log-probabilities
        over the draft vocabulary [R, k], after pre-norm outputs [R, H]."""
        logits = self.logits(outputs)  # [R, draft_vocab]
        top = logits.topk(k, dim=-1)  # [R, k]
        return draft_to_target(top.indices, self.d2t), top.values - torch.logsumexp(logits, dim=-1, keepdim=True)


def _opt(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
    value = tensors.get(name)
    return None if value is None else value.float()


class Drafts(Protocol):
    """What :func:`draft_trees` asks of a drafter (:class:`Eagle3Drafter`)."""

    def forward(self, items: list[DraftInput]) -> list[torch.Tensor]: ...

    def candidates(self, outputs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]: ...


def draft_trees(drafter: Drafts, rule: DynamicTree, catch_up: list[DraftInput], depths: list[int]) -> list[Draft]:
    """Each request's draft, grown by ``rule`` at most ``depths[i]`` levels deep (its remaining tokens).

    ``catch_up[i]``: the entries of the tokens request i committed last step; the drafter's output at
    the last one, o_n, gives the root's children. A node at depth d is the entry (its token, the output
    that drafted it: its parent's) at position n + d - 1, seeing the committed entries, its ancestors and
    itself; its output gives its children. The draft entries stay in the drafter caches (the caller
    truncates them to ``Draft.committed``).

    Worked example, k = 2, K = 2, 3 nodes kept: the root's candidates a (log-prob -0.1) and b (-0.5) are
    level 1; both are expanded (the 2 best), a giving c (-0.2, path -0.3) and d (-1.0, -1.1), b giving
    e (-0.1, -0.6) and f (-2.0, -2.5). The best 3 paths are a (-0.1), c (-0.3) and b (-0.5): the tree
    verified is tokens (a, b, c) with parents (root, root, a). With k = 1 the tree is the chain.
    """
    outs = drafter.forward(catch_up)  # [n_i, H] per request
    roots = torch.cat([out[-1:] for out in outs])  # [R, H]: o_n, the root's children's drafter output
    drafts = [
        Draft(item.cache.length, [(-1, o, top)])  # o: [H]
        for item, o, top in zip(catch_up, roots, _candidates(drafter, roots, rule.top_k))
    ]
    for depth in range(1, rule.depth + 1):
        growing = [i for i, most in enumerate(depths) if most >= depth]
        for i in growing:
            rule.grow(drafts[i], depth)  # the frontier's k children each
        picked = [(i, rule.to_expand(drafts[i], depth)) for i in growing if depths[i] > depth]
        picked = [(i, nodes) for i, nodes in picked if nodes]
        if not picked:
            break
        entries = [drafts[i].expansion(catch_up[i].cache, nodes, depth) for i, nodes in picked]
        outs = drafter.forward(entries)  # [nodes_i, H] per expanding request
        tops = iter(_candidates(drafter, torch.cat(outs), rule.top_k))  # over [sum nodes_i, H]
        for (i, nodes), out in zip(picked, outs):
            drafts[i].frontier = [(node, o, next(tops)) for node, o in zip(nodes, out)]  # o: [H]
    return drafts


def _candidates(drafter: Drafts, outputs: torch.Tensor, k: int) -> list[Candidates]:
    """Per row of drafter outputs [R, H]: its top-k tokens and their log-probs."""
    tokens, log_probs = drafter.candidates(outputs, k)  # [R, k], [R, k]
    return list(zip(tokens.tolist(), log_probs.tolist()))


@dataclass
class _State:
    cache: KVCache  # the drafter's: committed entries only between steps
    tokens: list[int] = field(default_factory=list)  # pending entries not yet in the cache: x_{j+1} ...
    captured: list[torch.Tensor] = field(default_factory=list)  # ... and the target's captured rows at j
    proposal: Proposal | None = None


class Eagle3Decoding(DecodingMethod):
    """EAGLE-3 (Li et al., arXiv 2503.01840): a chain of K = ``max_draft_len`` drafts per step, or
    (``use_dynamic_tree``) TensorRT-LLM's dynamic tree, K levels of the top-k children of the k best
    nodes by cumulative draft log-probability, its best ``max_total_draft_tokens`` nodes verified (the
    EAGLE-2 rule, :class:`~pipeline.runtime.spec_decode.eagle.trees.DynamicTree`; the chain is its k = 1).

    One step, for every running request at once (:meth:`propose`):

    1. catch up: one causal drafter pass over the entries of the tokens committed last step (their
       captured target states came back with the verification rows, fused by fc); the last output
       o_n drafts the children of the root x_n (the last committed token);
    2. draft level by level (:func:`draft_trees`): each expanded node's entry (its token, its parent's
       output) at position n + depth - 1 drafts its children, up to K levels (fewer when the request
       may emit fewer tokens); the draft entries are then dropped from the drafter cache;
    3. the target verifies x_n and the tree in one pass (tree_verify): a node is *accepted* while it
       equals the target's own choice after its accepted parent; the target's choice where no child
       matches is the *bonus* token. Every emitted token is the target's own choice, so greedy output
       equals plain decoding's.
    """

    name = "eagle3"
    prompt_hidden = True  # the drafter reads every prompt row's captured states

    def __init__(self, engine: Engine, config: Eagle3Config, drafter: Path):
        if engine.tp != 1 or engine.pp != 1:
            raise InputError(
                f"EAGLE-3 on the reference backend needs tp=1 and pp=1; {engine.config.folder} has "
                f"tp {engine.tp}, pp {engine.pp}: build the reference engine with parallel tp 1, pp 1"
            )
        if config.max_draft_len < 1:
            raise InputError(f"EAGLE-3 max_draft_len must be at least 1, got {config.max_draft_len}")
        if config.use_dynamic_tree:
            problem = tree_problem(config.max_draft_len, config.dynamic_tree_max_top_k, config.max_total_draft_tokens)
            if problem is not None:
                raise InputError(f"EAGLE-3 dynamic tree: {problem}")
        self.drafter = Eagle3Drafter(engine, drafter)
        if tuple(config.capture_layers) != self.drafter.capture_layers:
            raise InputError(
                f"EAGLE-3 capture layers {list(config.capture_layers)} differ from the drafter's "
                f"{list(self.drafter.capture_layers)} ({Path(drafter) / 'config.json'}); re-plan with this drafter"
            )
        self.config = config
        self.capture_layers = self.drafter.capture_layers
        top_k = config.dynamic_tree_max_top_k if config.use_dynamic_tree else 1
        self.rule = DynamicTree(top_k, config.max_draft_len, config.total_draft_tokens)
        self.max_draft_len = self.rule.max_draft_len  # tree nodes: the KV-cache room a step needs
        self.draft_positions = config.max_draft_len

    def _state(self, seq: Sequence) -> _State:
        if self.name not in seq.state:
            seq.state[self.name] = _State(self.drafter.new_cache(seq.cache.limit + self.rule.max_expanded))
        return seq.state[self.name]  # type: ignore[return-value]

    def propose(self, seqs: list[Sequence]) -> None:
        todo = [seq for seq in seqs if self._state(seq).proposal is None]
        if not todo:
            return
        states = [self._state(seq) for seq in todo]
        # How deep each request may draft: K, cut to what it may still emit.
        room = [len(seq.request.input_ids) + seq.request.max_new_tokens - 1 - len(seq.tokens) for seq in todo]
        depths = [min(self.config.max_draft_len, r) for r in room]
        # 1. Catch up on the committed tokens with their fused target states.
        fused = self.drafter.fuse(torch.cat([c for s in states for c in s.captured]))  # [sum n, H]
        items, start = [], 0
        for s in states:
            n = len(s.tokens)
            positions = list(range(s.cache.length, s.cache.length + n))
            items.append(DraftInput(s.cache, s.tokens, fused[start : start + n], positions))  # fused rows [n, H]
            start += n
        for s in states:
            s.tokens, s.captured = [], []
        # 2. Draft each request's tree (the chain when k = 1), level by level.
        drafts = draft_trees(self.drafter, self.rule, items, depths)
        # 3. Drop the draft entries; the target verifies each tree next step.
        for seq, state, draft in zip(todo, states, drafts):
            state.cache.truncate(draft.committed)
            state.proposal = Proposal.of_tree(seq.cache, seq.generated[-1], self.rule.final(draft))
            state.proposal.input.capture_layers = self.capture_layers

    def generation_input(self, seq: Sequence) -> StepInput:
        if self._state(seq).proposal is None:
            self.propose([seq])
        proposal = self._state(seq).proposal
        assert proposal is not None
        return proposal.input

    def accept(self, seq: Sequence, rows: StepRows, after_prefill: bool) -> Accepted:
        state = self._state(seq)
        assert rows.captured is not None, "EAGLE-3 needs the captured layers (StepInput.capture_layers)"
        if after_prefill:  # pending: entries j = 0..p-1 pair x_{j+1} with the captured rows at j
            first = seq.sample(rows.logits[-1])
            state.captured.append(rows.captured)  # [p, k * H_target]
            state.tokens = [*seq.request.input_ids[1:], first]
            return Accepted([first])
        proposal, state.proposal = state.proposal, None
        assert proposal is not None  # generation_input made it
        verdict = verify(proposal, rows, seq.cache, seq.sample)
        # The committed tokens' captured rows (root and accepted nodes), each paired with the token after it.
        state.tokens += verdict.tokens
        state.captured.append(rows.captured[verdict.rows()])  # [1 + accepted, k * H_target]
        return Accepted(verdict.tokens, len(proposal.tree), verdict.accepted_drafts)

    def prompt_chunk(self, seq: Sequence, rows: StepRows) -> None:
        assert rows.captured is not None
        self._state(seq).captured.append(rows.captured)  # [chunk, k * H_target]


def _claims(settings: MethodSettings) -> bool:
    """EAGLE-3's settings or drafter select it: its engine is built without a speculative mode."""
    return settings.eagle3 is not None or settings.eagle3_drafter is not None


def _rehearsed(engine: Engine, chain: Eagle3Config | None, measuring: Measuring) -> list[Candidate]:
    """The plan's drafter (in ``measuring.heads``) drafting its chain of max_draft_len, or its dynamic tree."""
    if chain is None or measuring.heads is None:
        return []
    k = chain.max_draft_len
    name, describe = f"eagle3(k {k})", f"EAGLE-3, a chain of {k} drafts"
    if chain.use_dynamic_tree:
        top, nodes = chain.dynamic_tree_max_top_k, chain.total_draft_tokens
        name = f"eagle3(k {k}, top {top}, {nodes} nodes)"
        describe = f"EAGLE-3, a dynamic tree {k} deep (top-{top}) of {nodes} nodes"
    settings = MethodSettings(eagle3=chain, eagle3_drafter=measuring.heads)
    return [Candidate(name, "eagle3", settings, chain.drafting(), describe=describe, max_draft_len=k)]


@register("eagle3", claims=_claims, candidates=_rehearsed)
def _from_settings(engine: Engine, settings: MethodSettings, warnings: list[str]) -> DecodingMethod:
    if settings.eagle3 is None or settings.eagle3_drafter is None:
        raise InputError("EAGLE-3 needs both its settings (max_draft_len, capture layers) and the drafter folder")
    return Eagle3Decoding(engine, settings.eagle3, settings.eagle3_drafter)
