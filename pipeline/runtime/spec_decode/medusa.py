"""Medusa (arXiv 2401.10774): extra heads on the base model's last hidden state draft a token tree.

Conventions (the converter's ``MedusaForCausalLM`` checkpoint, TensorRT-LLM's MedusaHead): head i
reads h_t, the base model's final hidden state AFTER the final norm (what lm_head sees), and
predicts token t+2+i (the base model itself predicts t+1): x = h_t; per ResBlock
x = x + silu(W x + b); logits_i = lm_head_i(x). With tp > 1 the ResBlock linears are
column-parallel (each rank holds rows of W; outputs are concatenated) and lm_head_i is
vocab-parallel, padded like the base lm_head.

One step, for all running requests at once (:meth:`MedusaDecoding.propose`):
1. the heads read the hidden state of each request's last committed token, the row that
   produced its root (the token chosen last step, not yet in the KV cache);
2. the ``medusa_choices`` tree takes, for a node at depth d with path (..., r), the r-th best
   candidate of head d-1;
3. the target verifies root + tree in one pass (tree_verify); the accepted path stays in the KV
   cache, and the last accepted row's hidden state feeds the heads next step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from pipeline import trees
from pipeline.errors import InputError
from pipeline.methods.drafting import Drafting
from pipeline.plan.speculative import engine_mode_method
from pipeline.runtime.model.engine import Engine, StepInput, StepRows
from pipeline.runtime.model.gemm import Gemm
from pipeline.runtime.model.layers import prepare_linear
from pipeline.runtime.spec_decode.base import Accepted, DecodingMethod, Sequence
from pipeline.runtime.spec_decode.parameters import TritonParameters
from pipeline.runtime.spec_decode.registry import Candidate, Measuring, MethodSettings, register
from pipeline.runtime.spec_decode.tree_verify import DraftTree, Proposal, TreeShape, verify

if TYPE_CHECKING:
    from pipeline.methods.medusa import MedusaConfig


class MedusaHeads:
    """The heads of an engine's last pipeline stage, evaluated rank by rank as TensorRT-LLM does."""

    def __init__(self, engine: Engine):
        stage = engine.stage(engine.pp - 1)
        self.num_heads = len(stage[0].medusa)
        if self.num_heads == 0:
            raise InputError(
                f"{engine.config.folder}: the rank files hold no medusa_heads.* tensors; rebuild the Medusa engine"
            )
        self.engine = engine
        self.shards = [rank.medusa for rank in stage]  # [tp_rank][head]
        for head in (h for heads in self.shards for h in heads):
            head.layers = [prepare_linear(linear, engine.bf16) for linear in head.layers]
        # Heads trained on a frozen lm_head (specdeploy's, ModelOpt's usual setup) all share the base
        # lm_head: then one GEMM over every head's rows reads the largest matrix once, not once per head.
        self.lm_heads: list[list[Gemm]] | None = (
            None
            if engine.adopt_lm_head(self.shards)
            else [[Gemm(heads[h].lm_head, bf16=engine.bf16) for heads in self.shards] for h in range(self.num_heads)]
        )

    def features(self, hidden: torch.Tensor, head: int) -> torch.Tensor:
        """x after head ``head``'s ResBlocks, [R, H] from [R, H]."""
        x = hidden
        for layer in range(len(self.shards[0][head].layers)):
            x = x + F.silu(torch.cat([heads[head].layers[layer](x) for heads in self.shards], dim=-1))
        return x

    def logits(self, hidden: torch.Tensor, num_heads: int) -> torch.Tensor:
        """[num_heads, R, vocab] logits of the first ``num_heads`` heads."""
        xs = [self.features(hidden, h) for h in range(num_heads)]
        if self.lm_heads is None:
            return self.engine.lm_head(torch.cat(xs)).view(num_heads, hidden.shape[0], -1)
        return torch.stack([self.engine.lm_head(x, self.lm_heads[h]) for h, x in enumerate(xs)])


@dataclass
class _State:
    hidden: torch.Tensor  # [H]: final hidden state of the last committed token (it produced the root)
    proposal: Proposal | None = None


class MedusaDecoding(DecodingMethod):
    name = "medusa"

    def __init__(self, engine: Engine, tree: trees.Tree):
        self.heads = MedusaHeads(engine)
        self.shape = TreeShape.of(tree)
        limit = engine.config.limits.max_draft_len
        if self.shape.depth > self.heads.num_heads:
            raise InputError(
                f"medusa_choices: tree depth {self.shape.depth} exceeds the engine's "
                f"{self.heads.num_heads} Medusa heads; use a shallower tree"
            )
        if len(self.shape) > limit:
            raise InputError(
                f"medusa_choices: {len(self.shape)} tree nodes exceed the engine's max_draft_len "
                f"{limit}; use a smaller tree (or rebuild with a larger max_draft_len)"
            )
        self.max_draft_len = len(self.shape)
        self.draft_positions = self.shape.depth

    def _state(self, seq: Sequence) -> _State:
        return seq.state[self.name]  # type: ignore[return-value]

    def propose(self, seqs: list[Sequence]) -> None:
        todo = [seq for seq in seqs if self._state(seq).proposal is None]
        if not todo:
            return
        hidden = torch.stack([self._state(seq).hidden for seq in todo])
        # [depth, R, top_k]: candidates of head d for every request
        candidates = self.heads.logits(hidden, self.shape.depth).topk(self.shape.top_k, dim=-1).indices.tolist()
        for r, seq in enumerate(todo):
            tokens = tuple(candidates[len(path) - 1][r][path[-1]] for path in self.shape.paths)
            tree = DraftTree(tokens, self.shape.parents)
            self._state(seq).proposal = Proposal.of_tree(seq.cache, seq.generated[-1], tree)

    def generation_input(self, seq: Sequence) -> StepInput:
        if self._state(seq).proposal is None:
            self.propose([seq])
        return self._state(seq).proposal.input  # type: ignore[union-attr]

    def accept(self, seq: Sequence, rows: StepRows, after_prefill: bool) -> Accepted:
        if after_prefill:
            seq.state[self.name] = _State(rows.hidden[-1])
            return Accepted([seq.sample(rows.logits[-1])])
        state = self._state(seq)
        proposal, state.proposal = state.proposal, None
        assert proposal is not None  # generation_input made it
        verdict = verify(proposal, rows, seq.cache, seq.sample)
        state.hidden = rows.hidden[verdict.rows()[-1]]
        return Accepted(verdict.tokens, len(proposal.tree), verdict.accepted_drafts)


def _rehearsed(engine: Engine, config: MedusaConfig | None, measuring: Measuring) -> list[Candidate]:
    """On an engine built with Medusa heads: the plan's tree (TensorRT-LLM's default without one) and the
    presets of a similar size that the heads and the build's max_draft_len fit."""
    heads = len(engine.stage(engine.pp - 1)[0].medusa)
    if engine_mode_method(engine.config.limits.speculative_decoding_mode) != "medusa" or not heads:
        return []
    limit = engine.config.limits.max_draft_len
    return [
        Candidate(
            f"medusa[{trees.tree_name(tree)}]",
            "medusa",
            MethodSettings("medusa", medusa_choices=tree),
            Drafting.medusa(tree, heads),
            describe=f"medusa_choices {trees.tree_name(tree)}, {len(tree)} nodes",
            max_draft_len=limit,
        )
        for tree in trees.similar_trees((config.tree if config else None) or trees.MC_SIM_7B_63, heads, limit)
    ]


def _parameters(read: TritonParameters) -> dict[str, Any]:
    return {"medusa_choices": read.tree("medusa_choices")}


@register("medusa", candidates=_rehearsed, parameters=_parameters)
def _from_settings(engine: Engine, settings: MethodSettings, warnings: list[str]) -> DecodingMethod:
    """The engine's heads over ``medusa_choices``, else TensorRT-LLM's default tree (with a warning)."""
    if settings.medusa_choices is None:
        warnings.append(
            "medusa_choices parameter is not specified; using the default mc_sim_7b_63 (as TensorRT-LLM does)"
        )
    return MedusaDecoding(engine, settings.medusa_choices or trees.MC_SIM_7B_63)
