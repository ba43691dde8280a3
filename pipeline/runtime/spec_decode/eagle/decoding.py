"""EAGLE-1 (arXiv 2401.15077) static trees and EAGLE-2 (arXiv 2406.16858) dynamic trees.

A one-layer drafter (drafter.py) predicts the base model's next *feature* autoregressively. Each
request has its own drafter KV cache which, between steps, holds only entries made from TRUE
features (committed tokens). One step, for all running requests at once (:meth:`EagleDecoding.propose`):

1. catch up: one causal drafter pass over the entries of the tokens committed last step (their
   true features came back with the verification rows); its last output f'_n predicts the
   children of the root x_n;
2. draft level by level, up to num_eagle_layers deep: a node at depth d (a guess for x_{n+d}) is
   the entry concat[embed(its token), its parent's f'] at position n+d-1, attending to the
   committed entries, its ancestors' entries and itself; its output gives its children. Which
   children each node keeps and which nodes are expanded is the tree rule's (trees.py: EAGLE-1's
   ``eagle_choices``, or EAGLE-2's scores);
3. the draft entries are dropped (the cache is truncated back); the target verifies the tree in
   one pass (tree_verify) and the accepted tokens' true features become next step's catch-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from pipeline import trees
from pipeline.errors import InputError
from pipeline.methods.drafting import Drafting
from pipeline.methods.eagle import DYNAMIC_TREE_KEY, DYNAMIC_TREE_TOP_K_KEY
from pipeline.plan.speculative import engine_mode_method
from pipeline.runtime.model.engine import Engine, StepInput, StepRows
from pipeline.runtime.model.kv_cache import KVCache
from pipeline.runtime.spec_decode.base import Accepted, DecodingMethod, Sequence
from pipeline.runtime.spec_decode.eagle.drafter import Drafter, DraftInput
from pipeline.runtime.spec_decode.eagle.trees import Candidates, Draft, DynamicTree, StaticTree, TreeRule
from pipeline.runtime.spec_decode.parameters import TritonParameters
from pipeline.runtime.spec_decode.registry import Candidate, Measuring, MethodSettings, register
from pipeline.runtime.spec_decode.tree_verify import Proposal, verify

if TYPE_CHECKING:
    from pipeline.methods.eagle import EagleConfig


@dataclass
class _State:
    cache: KVCache  # the drafter's KV cache
    tokens: list[int] = field(default_factory=list)  # pending entries not yet in the cache: x_{j+1} ...
    features: list[torch.Tensor] = field(default_factory=list)  # ... and f_j ([m, H] blocks)
    proposal: Proposal | None = None


class EagleDecoding(DecodingMethod):
    name = "eagle"
    prompt_hidden = True  # the drafter reads the features of the whole prompt

    def __init__(self, engine: Engine, tree: trees.Tree | None = None, dynamic_top_k: int | None = None):
        self.drafter = Drafter(engine)
        pretrained = engine.config.raw["pretrained_config"]
        layers = int(pretrained.get("num_eagle_layers") or 0)
        limit = engine.config.limits.max_draft_len
        self.rule: TreeRule = (
            StaticTree(tree, layers, int(pretrained.get("max_non_leaves_per_layer") or 0) or None, limit)
            if tree is not None
            else DynamicTree(dynamic_top_k, layers, limit)
        )
        if self.rule.depth < 1 or self.rule.max_draft_len < 1:
            raise InputError(
                f"{engine.config.folder}: num_eagle_layers {layers} / max_draft_len {limit} leave "
                "no room for drafts; rebuild the EAGLE engine"
            )
        self.max_draft_len = self.rule.max_draft_len
        self.draft_positions = self.rule.depth

    def propose(self, seqs: list[Sequence]) -> None:
        todo = [seq for seq in seqs if self._state(seq).proposal is None]
        if not todo:
            return
        states = [self._state(seq) for seq in todo]
        # 1. Catch up on the committed tokens; each request's last output f'_n predicts the root's children.
        outs = self.drafter.forward(
            [
                DraftInput(
                    s.cache,
                    s.tokens,
                    torch.cat(s.features),
                    list(range(s.cache.length, s.cache.length + len(s.tokens))),
                )
                for s in states
            ]
        )
        roots = torch.stack([out[-1] for out in outs])  # [R, H]
        drafts = [Draft(s.cache.length, [(-1, f, top)]) for s, f, top in zip(states, roots, self._candidates(roots))]
        for s in states:
            s.tokens, s.features = [], []
        # 2. Draft level by level: add the frontier's children, then expand the chosen nodes in one batch.
        for depth in range(1, self.rule.depth + 1):
            for draft in drafts:
                self.rule.grow(draft, depth)
            if depth == self.rule.depth:
                break
            expanding = [(draft, state, self.rule.to_expand(draft, depth)) for draft, state in zip(drafts, states)]
            expanding = [e for e in expanding if e[2]]
            if not expanding:
                break
            outs = self.drafter.forward(
                [draft.expansion(state.cache, picked, depth) for draft, state, picked in expanding]
            )
            candidates = iter(self._candidates(torch.cat(outs)))
            for (draft, _, picked), out in zip(expanding, outs):
                draft.frontier = [(node, f, next(candidates)) for node, f in zip(picked, out)]
        # 3. Drop the draft entries; the target verifies the final tree next step.
        for seq, state, draft in zip(todo, states, drafts):
            state.cache.truncate(draft.committed)
            state.proposal = Proposal.of_tree(seq.cache, seq.generated[-1], self.rule.final(draft))

    def generation_input(self, seq: Sequence) -> StepInput:
        if self._state(seq).proposal is None:
            self.propose([seq])
        return self._state(seq).proposal.input  # type: ignore[union-attr]

    def accept(self, seq: Sequence, rows: StepRows, after_prefill: bool) -> Accepted:
        state = self._state(seq)
        if after_prefill:  # pending: entries j = 0..p-1 pair x_{j+1} with f_j
            first = seq.sample(rows.logits[-1])
            state.features.append(rows.hidden)
            state.tokens = [*seq.request.input_ids[1:], first]
            return Accepted([first])
        proposal, state.proposal = state.proposal, None
        assert proposal is not None  # generation_input made it
        verdict = verify(proposal, rows, seq.cache, seq.sample)
        # The committed tokens' true features, each paired with the token after it.
        state.tokens += verdict.tokens
        state.features.append(rows.hidden[verdict.rows()])
        return Accepted(verdict.tokens, len(proposal.tree), verdict.accepted_drafts)

    def prompt_chunk(self, seq: Sequence, rows: StepRows) -> None:
        self._state(seq).features.append(rows.hidden)

    def _state(self, seq: Sequence) -> _State:
        if self.name not in seq.state:
            seq.state[self.name] = _State(self.drafter.new_cache(seq.cache.limit + self.rule.max_expanded))
        return seq.state[self.name]  # type: ignore[return-value]

    def _candidates(self, h: torch.Tensor) -> list[Candidates]:
        """Per row of drafter outputs [R, H]: its top-k tokens and their log-probs (k: what the tree needs)."""
        tokens, log_probs = self.drafter.candidates(h, self.rule.top_k)
        return list(zip(tokens.tolist(), log_probs.tolist()))


DEFAULT_DYNAMIC_TREE_TOP_K = 10  # the spec's default for speculative.eagle.dynamic_tree_max_top_k


def _rehearsed(engine: Engine, config: EagleConfig | None, measuring: Measuring) -> list[Candidate]:
    """On an engine built with an EAGLE drafter: EAGLE-1 over the plan's static tree (TensorRT-LLM's
    default without one) and EAGLE-2's dynamic tree at ``measuring.eagle_top_k``."""
    if engine_mode_method(engine.config.limits.speculative_decoding_mode) != "eagle":
        return []
    limit = engine.config.limits.max_draft_len
    layers = int(engine.config.raw["pretrained_config"].get("num_eagle_layers") or 0)
    tree = (config.tree if config else None) or trees.MC_SIM_7B_63
    top_k = measuring.eagle_top_k
    return [
        Candidate(
            f"eagle[{trees.tree_name(tree)}]",
            "eagle",
            MethodSettings("eagle", eagle_choices=tree),
            Drafting.eagle(tree),
            describe=f"EAGLE-1, eagle_choices {trees.tree_name(tree)}",
            max_draft_len=limit,
        ),
        Candidate(
            f"eagle2(top_k {top_k})",
            "eagle",
            MethodSettings("eagle", eagle_dynamic_tree=True, eagle_dynamic_tree_max_top_k=top_k),
            Drafting.eagle_dynamic(top_k, layers, limit),
            describe=f"EAGLE-2 dynamic tree, top_k {top_k}, at most {limit} nodes",
            max_draft_len=limit,
        ),
    ]


def _parameters(read: TritonParameters) -> dict[str, Any]:
    """``eagle_choices``, and EAGLE-2's reference-only keys (the C++ backend exposes no dynamic tree)."""
    return {
        "eagle_choices": read.tree("eagle_choices"),
        "eagle_dynamic_tree": read.boolean(DYNAMIC_TREE_KEY, False),
        "eagle_dynamic_tree_max_top_k": read.integer(DYNAMIC_TREE_TOP_K_KEY, None),
    }


@register("eagle", candidates=_rehearsed, parameters=_parameters)
def _from_settings(engine: Engine, settings: MethodSettings, warnings: list[str]) -> DecodingMethod:
    """EAGLE-2's dynamic tree (``reference_eagle_use_dynamic_tree``), else EAGLE-1's ``eagle_choices``
    (TensorRT-LLM's default tree, with a warning, when unset)."""
    if settings.eagle_dynamic_tree and settings.eagle_choices is not None:
        raise InputError(
            "eagle_choices and reference_eagle_use_dynamic_tree are mutually exclusive "
            "(EAGLE-2 builds its own tree); drop one of them"
        )
    if settings.eagle_dynamic_tree:
        return EagleDecoding(engine, dynamic_top_k=settings.eagle_dynamic_tree_max_top_k or DEFAULT_DYNAMIC_TREE_TOP_K)
    if settings.eagle_choices is None:
        warnings.append(
            "eagle_choices parameter is not specified; using the default mc_sim_7b_63 (as TensorRT-LLM does)"
        )
    return EagleDecoding(engine, tree=settings.eagle_choices or trees.MC_SIM_7B_63)
