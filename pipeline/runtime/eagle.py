"""EAGLE-1 (arXiv 2401.15077) static trees and EAGLE-2 (arXiv 2406.16858) dynamic trees.

A one-layer drafter predicts the base model's next *feature* autoregressively. Conventions (the
converter's ``EagleForCausalLM`` checkpoint, pipeline/heads/eagle.py, reference_forward.eagle_forward):
feature f_t = the base model's final hidden state AFTER the final norm at position t; the drafter
entry at position t is concat[embed(x_{t+1}), f_t] (embedding first) -> fc (2H -> H, bias;
column-parallel) -> decoder layer(s), the first without input_layernorm -> f'_{t+1}, and
lm_head(f'_{t+1}) (no final norm) predicts x_{t+2}.

Each request has its own drafter KV cache which, between steps, holds only entries made from TRUE
features (committed tokens). One step, for all running requests at once (:meth:`EagleDecoding.propose`):

1. catch up: one causal drafter pass over the entries of the tokens committed last step (their
   true features came back with the verification rows); its last output f'_n predicts the
   children of the root x_n;
2. draft level by level, up to num_eagle_layers deep: a node at depth d (a guess for x_{n+d}) is
   the entry concat[embed(its token), its parent's f'] at position n+d-1, attending to the
   committed entries, its ancestors' entries and itself; its output gives its children;
   * EAGLE-1: the ``eagle_choices`` tree says which candidates (top-k ranks) each node keeps;
   * EAGLE-2: a node's score is its path's cumulative drafter log-probability; each level
     expands the top_k best nodes with top_k children each, then the best max_draft_len nodes
     are kept (scores only fall along a path, so every kept node's ancestors are kept too);
3. the draft entries are dropped (the cache is truncated back); the target verifies the tree in
   one pass (tree_verify) and the accepted tokens' true features become next step's catch-up.

The converter writes num_eagle_layers identical copies ``eagle_nets.{i}`` (TensorRT-LLM runs copy i
at draft level i); one set of weights and one cache per request are therefore the same thing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from pipeline import trees
from pipeline.checkpoint.reference_forward import Geometry, LayerShard, fake_quant_fp8, mlp, rms_norm, rope_inv_freq, \
    rope_tables, rotate
from pipeline.errors import InputError
from pipeline.runtime.decoding import Accepted, Sequence
from pipeline.runtime.engine import Engine, StepInput, StepRows, _all_reduce
from pipeline.runtime.gemm import Gemm, prepare_linear
from pipeline.runtime.kv_cache import KVCache
from pipeline.runtime.tree_verify import DraftTree, Proposal, TreeShape, verify


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


class Drafter:
    """The EAGLE-1 drafter of an engine (eagle_nets.0 of every tp rank), batched over requests."""

    def __init__(self, engine: Engine):
        pretrained = engine.config.raw["pretrained_config"]
        net = pretrained.get("eagle_net_config")
        if not isinstance(net, dict) or not engine.ranks[0].eagle:
            raise InputError(f"{engine.config.folder}: no eagle_net_config / eagle_nets.* tensors; rebuild the "
                             "EAGLE engine")
        if engine.pp != 1:
            raise InputError("EAGLE needs pp=1 (TensorRT-LLM: pipeline parallelism is not supported in EAGLE)")
        tp, hidden = engine.tp, engine.config.model.hidden_size
        heads = int(net["num_attention_heads"])
        head_size = int(net.get("head_size") or hidden // heads)
        self.geo = Geometry(heads // tp, max(int(net.get("num_key_value_heads") or heads) // tp, 1), head_size,
                            float(net.get("norm_epsilon", 1e-5)))
        self.inv_freq = rope_inv_freq(head_size, float(net.get("rotary_base", 10000.0)), net.get("rotary_scaling"))
        for rank in engine.ranks:
            # TensorRT-LLM runs copy i at draft level i; the converter writes identical copies and this
            # drafter runs copy 0 at every level, so a checkpoint whose trained parts differ is refused.
            # (Comparing the copies' embeddings and lm_heads too would page in hundreds of MB of an
            # untouched float32 file; EAGLE-1 copies them all from the base model.)
            if not all(same_weights((net.fc, net.layers), (rank.eagle[0].fc, rank.eagle[0].layers))
                       for net in rank.eagle[1:]):
                raise InputError(f"{engine.config.folder}: rank {rank.rank}'s eagle_nets.* copies differ; the "
                                 "reference backend runs one drafter at every level (convert with specdeploy)")
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
        spans, start = [], 0
        for item in items:
            item.cache.reserve(len(item.tokens))
            spans.append((start, start + len(item.tokens)))
            start += len(item.tokens)
        ids = torch.tensor([t for item in items for t in item.tokens], dtype=torch.long)
        rope = rope_tables(torch.tensor([p for item in items for p in item.positions]), self.inv_freq)
        x = torch.cat((self.embedding[ids], torch.cat([item.features for item in items])), dim=-1)
        h = torch.cat([fc(x) for fc in self.fc], dim=-1)  # column-parallel fc, gathered
        for j, shards in enumerate(self.layers):
            norm = shards[0].input_layernorm  # None for the first drafter layer
            x = h if norm is None else rms_norm(h, norm, self.geo.eps)
            h = h + _all_reduce([self._attention(t, j, w, x, rope, items, spans) for t, w in enumerate(shards)])
            x = rms_norm(h, shards[0].post_layernorm, self.geo.eps)
            h = h + _all_reduce([mlp(w, x) for w in shards])
        for item in items:
            item.cache.advance(len(item.tokens))
        return [h[a:b] for a, b in spans]

    def _attention(self, tp_rank: int, layer: int, w: LayerShard, x: torch.Tensor,
                   rope: tuple[torch.Tensor, torch.Tensor], items: list[DraftInput], spans: list[tuple[int, int]]
                   ) -> torch.Tensor:
        T, d, geo = x.shape[0], self.geo.head_size, self.geo
        q, k, v = w.qkv(x).split([geo.heads * d, geo.kv_heads * d, geo.kv_heads * d], dim=-1)
        q = rotate(q.view(T, geo.heads, d).transpose(0, 1), *rope)
        k = rotate(k.view(T, geo.kv_heads, d).transpose(0, 1), *rope)
        v = v.view(T, geo.kv_heads, d).transpose(0, 1)
        if w.kv_cache_scale is not None:
            k, v = fake_quant_fp8(k, w.kv_cache_scale), fake_quant_fp8(v, w.kv_cache_scale)
        ctx = torch.empty(T, geo.heads, d)
        for item, (a, b) in zip(items, spans):
            keys, values = item.cache.write(tp_rank, layer, k[:, a:b], v[:, a:b])
            visible = item.visible
            if visible is None:  # the whole cache, causal among the new entries
                n, total = b - a, keys.shape[1]
                visible = torch.ones(n, total, dtype=torch.bool).tril(total - n)
            out = F.scaled_dot_product_attention(q[None, :, a:b], keys[None], values[None], attn_mask=visible,
                                                 enable_gqa=True)
            ctx[a:b] = out[0].transpose(0, 1)
        return w.dense(ctx.view(T, geo.heads * d))

    def candidates(self, h: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k most likely next tokens [R, k], best first, and their drafter log-probabilities
        [R, k], from outputs f' [R, H] (vocab-parallel lm_head). Only the k picked log-probabilities
        are computed (logit - logsumexp), not a log_softmax over the whole vocabulary per row."""
        logits = self.engine.lm_head(h, self.lm_heads)
        top = logits.topk(k, dim=-1)
        return top.indices, top.values - torch.logsumexp(logits, dim=-1, keepdim=True)


@dataclass
class _Node:
    token: int
    parent: int  # index into the draft's nodes, -1: the root
    depth: int
    score: float  # cumulative drafter log-probability of the path (EAGLE-2's value)
    shape_index: int = -1  # the node of a static tree


@dataclass
class _Draft:
    """One request's tree while it is being drafted."""

    committed: int  # drafter entries from true features (= the root's position n)
    nodes: list[_Node] = field(default_factory=list)
    # Nodes whose children come next: (node index, its output f', its top-k children: tokens and
    # log-probs, best first).
    frontier: list[tuple[int, torch.Tensor, tuple[list[int], list[float]]]] = field(default_factory=list)
    slots: dict[int, int] = field(default_factory=dict)  # expanded node -> its drafter-cache slot


@dataclass
class _State:
    cache: KVCache  # the drafter's KV cache
    tokens: list[int] = field(default_factory=list)  # pending entries not yet in the cache: x_{j+1} ...
    features: list[torch.Tensor] = field(default_factory=list)  # ... and f_j ([m, H] blocks)
    proposal: Proposal | None = None


class EagleDecoding:
    name = "eagle"
    prompt_hidden = True  # the drafter reads the features of the whole prompt

    def __init__(self, engine: Engine, tree: trees.Tree | None = None, dynamic_top_k: int | None = None):
        self.drafter = Drafter(engine)
        pretrained = engine.config.raw["pretrained_config"]
        layers = int(pretrained.get("num_eagle_layers") or 0)
        limit = engine.config.limits.max_draft_len
        self.shape = TreeShape.of(tree) if tree is not None else None
        self.top_k = dynamic_top_k
        if self.shape is not None:
            if self.shape.depth > layers:
                raise InputError(f"eagle_choices: tree depth {self.shape.depth} exceeds num_eagle_layers {layers} "
                                 "of the engine")
            widest = max(trees.non_leaves_per_level(self.shape.paths))
            most = int(pretrained.get("max_non_leaves_per_layer") or widest)
            if widest > most:
                raise InputError(f"eagle_choices: a level has {widest} non-leaf nodes, more than the engine's "
                                 f"max_non_leaves_per_layer {most}")
            if len(self.shape) > limit:
                raise InputError(f"eagle_choices: {len(self.shape)} tree nodes exceed the engine's max_draft_len "
                                 f"{limit}; use a smaller tree")
            self.depth, self.max_draft_len = self.shape.depth, len(self.shape)
            self._expandable = {parent for parent in self.shape.parents if parent >= 0}
            self._children = self.shape.children()
            self._expanded_max = len(self._expandable)
        else:
            if not self.top_k or self.top_k < 1:
                raise InputError(f"reference_eagle_dynamic_tree_max_top_k must be >= 1, got {self.top_k}")
            self.depth = layers
            # TensorRT-LLM's rule: top_k + top_k^2 * (num_eagle_layers - 1) nodes, capped by max_draft_len.
            self.max_draft_len = min(self.top_k + self.top_k ** 2 * (layers - 1), limit)
            self._expanded_max = self.top_k * (layers - 1)
        if self.depth < 1 or self.max_draft_len < 1:
            raise InputError(f"{engine.config.folder}: num_eagle_layers {layers} / max_draft_len {limit} leave "
                             "no room for drafts; rebuild the EAGLE engine")
        self.draft_positions = self.depth

    # -- per-request state ------------------------------------------------------------------------

    def _state(self, seq: Sequence) -> _State:
        if self.name not in seq.state:
            seq.state[self.name] = _State(self.drafter.new_cache(seq.cache.limit + self._expanded_max))
        return seq.state[self.name]  # type: ignore[return-value]

    def prompt_chunk(self, seq: Sequence, rows: StepRows) -> None:
        self._state(seq).features.append(rows.hidden)

    def accept(self, seq: Sequence, rows: StepRows, after_prefill: bool) -> Accepted:
        state = self._state(seq)
        if after_prefill:  # pending: entries j = 0..p-1 pair x_{j+1} with f_j
            first = seq.sample(rows.logits[-1])
            state.features.append(rows.hidden)
            state.tokens = [*seq.request.input_ids[1:], first]
            return Accepted([first])
        proposal, state.proposal = state.proposal, None
        verdict = verify(proposal, rows, seq.cache, seq.sample)
        # The committed tokens' true features, each paired with the token after it.
        state.tokens += verdict.tokens
        state.features.append(rows.hidden[verdict.rows()])
        return Accepted(verdict.tokens, len(proposal.tree), verdict.accepted_drafts)

    def generation_input(self, seq: Sequence) -> StepInput:
        if self._state(seq).proposal is None:
            self.propose([seq])
        return self._state(seq).proposal.input

    # -- drafting, batched over requests ---------------------------------------------------------

    def propose(self, seqs: list[Sequence]) -> None:
        todo = [seq for seq in seqs if self._state(seq).proposal is None]
        if not todo:
            return
        states = [self._state(seq) for seq in todo]
        outs = self.drafter.forward([DraftInput(s.cache, s.tokens, torch.cat(s.features),
                                                list(range(s.cache.length, s.cache.length + len(s.tokens))))
                                     for s in states])
        roots = torch.stack([out[-1] for out in outs])
        drafts = [_Draft(s.cache.length, frontier=[(-1, f, top)]) for s, f, top in zip(states, roots, self._top(roots))]
        for s in states:
            s.tokens, s.features = [], []
        for depth in range(1, self.depth + 1):
            for draft in drafts:
                self._grow(draft, depth)
            if depth == self.depth:
                break
            expanding = [(draft, state, self._pick(draft, depth)) for draft, state in zip(drafts, states)]
            expanding = [e for e in expanding if e[2]]
            if not expanding:
                break
            outs = self.drafter.forward([self._expansion(draft, state.cache, picked, depth)
                                         for draft, state, picked in expanding])
            tops = iter(self._top(torch.cat(outs)))
            for (draft, _, picked), out in zip(expanding, outs):
                draft.frontier = [(node, f, next(tops)) for node, f in zip(picked, out)]
        for seq, state, draft in zip(todo, states, drafts):
            state.cache.truncate(draft.committed)  # drop the draft entries
            state.proposal = Proposal.of_tree(seq.cache, seq.generated[-1], self._tree(draft))

    def _top(self, h: torch.Tensor) -> list[tuple[list[int], list[float]]]:
        """Per row of drafter outputs: its top-k tokens and their log-probs (k: what the tree needs)."""
        tokens, log_probs = self.drafter.candidates(h, self.shape.top_k if self.shape is not None else self.top_k)
        return list(zip(tokens.tolist(), log_probs.tolist()))

    def _grow(self, draft: _Draft, depth: int) -> None:
        """Add the children of the frontier nodes (all at depth - 1)."""
        for parent, _, (tokens, log_probs) in draft.frontier:
            score = draft.nodes[parent].score if parent >= 0 else 0.0
            if self.shape is not None:
                shape_parent = draft.nodes[parent].shape_index if parent >= 0 else -1
                picks = [(self.shape.paths[kid][-1], kid) for kid in self._children.get(shape_parent, [])]
            else:
                picks = [(rank, -1) for rank in range(self.top_k)]
            for rank, shape_index in picks:
                draft.nodes.append(_Node(tokens[rank], parent, depth, score + log_probs[rank], shape_index))

    def _pick(self, draft: _Draft, depth: int) -> list[int]:
        """Nodes at ``depth`` to run through the drafter (their children come next)."""
        level = [i for i, node in enumerate(draft.nodes) if node.depth == depth]
        if self.shape is not None:
            return [i for i in level if draft.nodes[i].shape_index in self._expandable]
        return sorted(level, key=lambda i: -draft.nodes[i].score)[: self.top_k]

    def _expansion(self, draft: _Draft, cache: KVCache, picked: list[int], depth: int) -> DraftInput:
        """Drafter entries of the picked nodes: each sees the committed entries, its ancestors, itself."""
        outputs = {node: f for node, f, _ in draft.frontier}  # the parents' predicted features
        visible = torch.zeros(len(picked), cache.length + len(picked), dtype=torch.bool)
        visible[:, : draft.committed] = True
        for row, node in enumerate(picked):
            draft.slots[node] = cache.length + row
            ancestor = node
            while ancestor >= 0:
                visible[row, draft.slots[ancestor]] = True
                ancestor = draft.nodes[ancestor].parent
        return DraftInput(cache, [draft.nodes[i].token for i in picked],
                          torch.stack([outputs[draft.nodes[i].parent] for i in picked]),
                          [draft.committed + depth - 1] * len(picked), visible)

    def _tree(self, draft: _Draft) -> DraftTree:
        keep = list(range(len(draft.nodes)))
        if self.shape is None and len(keep) > self.max_draft_len:
            # Rerank (EAGLE-2): the best max_draft_len nodes by path score; a node is kept only after
            # its parent (scores never rise along a path, ties go to the shallower node).
            kept: set[int] = set()
            for i in sorted(keep, key=lambda i: (-draft.nodes[i].score, draft.nodes[i].depth, i)):
                if len(kept) == self.max_draft_len:
                    break
                if draft.nodes[i].parent < 0 or draft.nodes[i].parent in kept:
                    kept.add(i)
            keep = sorted(kept)  # creation order is level by level, so parents come first
        index = {old: new for new, old in enumerate(keep)}
        return DraftTree(tuple(draft.nodes[i].token for i in keep),
                         tuple(index[draft.nodes[i].parent] if draft.nodes[i].parent >= 0 else -1 for i in keep))
