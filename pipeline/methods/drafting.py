"""What a method adds to one decoding step, per request: :class:`Drafting`, the cost model's input.

Each method's resolved config says its own (``MedusaConfig.drafting()``, ...); the cost model's step
models (pipeline/costmodel/step_gpu.py, step_cpu.py) price it from these fields alone:

* plain decoding: one row per request, logits for it;
* Medusa: K heads, each a ResBlock (hidden x hidden) and its own lm_head, over one row per request (the
  last accepted token's hidden state); rows fed = 1 + tree nodes;
* EAGLE-1 / EAGLE-2: per tree level, one drafter pass (fc 2 hidden x hidden + one decoder layer) and
  one lm_head pass over the nodes expanded at that level (level 0, over the accepted tokens, takes
  the logits of the last one only); rows fed = 1 + tree nodes;
* EAGLE-3's chain of K drafts: K drafter passes, the first over the accepted tokens (its fc fusing the
  captured layers, then one decoder layer whose q/k/v read 2 x hidden), each later one over the one
  token it drafted (the layer only: it feeds its own hidden state); rows fed = 1 + K. The GPU step
  model prices those weights exactly (:meth:`Drafting.eagle_level_params`), its lm_head over the
  drafter's own vocabulary (``draft_vocab``, from its ``draft_vocab_size``); the CPU one prices each
  pass as EAGLE's probed shapes;
* EAGLE-3's dynamic tree (top-k, K levels, N nodes): pass 0 over the accepted tokens, then k nodes a
  pass for K - 1 passes, as EAGLE-2's; rows fed = 1 + N, each a tree row;
* Lookahead (W, N, G): no weights; rows fed = (W + G)(N - 1) = 1 + max_draft_len.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from pipeline import trees
from pipeline.geometry import ModelGeometry

# The runtime constant charged per draft row (pipeline.costmodel.profile.RuntimeProfile), by the work it prices.
RowTerm = Literal["", "tree_row_s", "lookahead_row_s"]


class _DraftLength(Protocol):
    @property
    def max_draft_len(self) -> int: ...


@dataclass(frozen=True)
class Drafting:
    """A method's per-step work besides the verification pass, per request."""

    method: str  # the method's name (pipeline.methods)
    rows: int  # rows fed to the target per request per step
    medusa_heads: int = 0  # Medusa heads run over one row each
    eagle_level_rows: tuple[int, ...] = ()  # drafter rows per request at each tree level
    row_term: RowTerm = ""  # the runtime constant charged per draft row
    rows_vary: bool = False  # drafts come from a pool: a step feeds fewer rows when it has no match
    # EAGLE-3: the captured target layers its fc fuses, at level 0 only, and its layer's q/k/v read
    # [embedding; hidden] (2 x hidden); 0: EAGLE-1/2, whose fc reads [embedding; feature] at every level
    eagle_fused_layers: int = 0
    draft_vocab: int = 0  # EAGLE-3: its lm_head's rows (a reduced draft vocabulary, d2t); 0: the target's vocabulary

    @property
    def is_plain(self) -> bool:
        """Plain decoding: one row, its logits only."""
        return self.method == "none"

    @classmethod
    def plain(cls) -> Drafting:
        return cls("none", 1)

    @classmethod
    def medusa(cls, tree: trees.Tree, num_heads: int | None = None) -> Drafting:
        return cls("medusa", 1 + len(tree), medusa_heads=num_heads or trees.tree_depth(tree), row_term="tree_row_s")

    def eagle_levels(self) -> list[tuple[int, int]]:
        """(drafter rows, lm_head rows) per request of each EAGLE drafter pass: level 0 runs over the
        accepted tokens and takes the logits of the last (the root's children), each further level
        over the nodes it expands, with logits for each."""
        return [(rows, 1 if level == 0 else rows) for level, rows in enumerate(self.eagle_level_rows)]

    def eagle_level_params(self, arch: ModelGeometry, level: int) -> int:
        """The drafter weights one EAGLE pass at ``level`` runs, lm_head aside: EAGLE-1/2's fc (2 x hidden
        -> hidden) and decoder layer; EAGLE-3's decoder layer with q/k/v over 2 x hidden, and at level 0
        its fc over the fused captured layers (later levels feed the drafter's own hidden state)."""
        h = arch.hidden_size
        if not self.eagle_fused_layers:
            return arch.decoder_layer_params() + 2 * h * h
        wider_qkv = h * arch.head_dim * (arch.num_heads + 2 * arch.num_kv_heads)
        fusion = self.eagle_fused_layers * h * h if level == 0 else 0
        return arch.decoder_layer_params() + wider_qkv + fusion

    @classmethod
    def eagle(cls, tree: trees.Tree) -> Drafting:
        """EAGLE-1's static tree: level 0 runs over the accepted tokens (up to depth + 1 rows), level d
        over the tree's non-leaf nodes at depth d."""
        levels = trees.non_leaves_per_level(tree)
        depth = trees.tree_depth(tree)
        return cls("eagle", 1 + len(tree), eagle_level_rows=(depth + 1, *levels[1:]), row_term="tree_row_s")

    @classmethod
    def eagle_dynamic(cls, top_k: int, num_layers: int, max_draft_len: int) -> Drafting:
        """EAGLE-2: top_k nodes expanded per level after the first; max_draft_len nodes verified."""
        levels = (num_layers + 1, *([top_k] * (num_layers - 1)))
        return cls("eagle", 1 + max_draft_len, eagle_level_rows=levels, row_term="tree_row_s")

    @classmethod
    def eagle3(cls, max_draft_len: int, fused_layers: int = 3) -> Drafting:
        """EAGLE-3's linear chain: pass 0 over the accepted tokens (up to K + 1 rows), then one row a pass."""
        levels = (max_draft_len + 1, *([1] * (max_draft_len - 1)))
        return cls("eagle3", 1 + max_draft_len, eagle_level_rows=levels, eagle_fused_layers=fused_layers)

    @classmethod
    def eagle3_dynamic(
        cls, top_k: int, max_draft_len: int, max_total_draft_tokens: int, fused_layers: int = 3
    ) -> Drafting:
        """EAGLE-3's dynamic tree: pass 0 over the accepted tokens (up to K + 1 rows), then top_k nodes a
        pass for the K - 1 further levels; max_total_draft_tokens nodes verified.

            >>> Drafting.eagle3_dynamic(4, 3, 10).eagle_level_rows, Drafting.eagle3_dynamic(4, 3, 10).rows
            ((4, 4, 4), 11)
        """
        levels = (max_draft_len + 1, *([top_k] * (max_draft_len - 1)))
        rows = 1 + max_total_draft_tokens
        return cls("eagle3", rows, eagle_level_rows=levels, row_term="tree_row_s", eagle_fused_layers=fused_layers)

    @classmethod
    def lookahead(cls, config: _DraftLength) -> Drafting:
        return cls("lookahead", 1 + config.max_draft_len, row_term="lookahead_row_s", rows_vary=True)

    @classmethod
    def ngram(cls, max_draft_len: int) -> Drafting:
        """A chain of up to K drafts looked up in the text; no weights."""
        return cls("ngram", 1 + max_draft_len, rows_vary=True)
