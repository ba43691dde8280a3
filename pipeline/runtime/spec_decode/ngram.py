"""NGram (prompt lookup): drafts copied from where the text's tail occurred before, verified as a chain.

The pool follows TensorRT-LLM's PyTorch backend (``NGramPoolManager``,
tensorrt_llm/_torch/speculative/ngram.py): it maps a *pattern* (1 to M tokens) to the *matches* that
followed it (up to K tokens each). Each step it takes every pattern-match pair of the text newer
than its last scan, then drafts the match of the longest tail of the text that is a pattern.

* ``keep_all``: a pattern keeps every match, shorter ones dropped when a longer one arrives;
  otherwise a longer match replaces the kept one (one no longer is still added beside it, as
  TensorRT-LLM's pool does, though its docstring says one match is kept);
* ``use_oldest``: draft the oldest kept match (else the newest);
* ``public_pool``: one pool for every request (else one per request, dropped when it ends).

The drafts never change the output: they are verified as a chain in one target pass (tree_verify),
the longest agreeing prefix is kept and the target's own next token follows it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import InputError
from pipeline.methods.ngram import NGRAM_TRITON_KEYS, NGramConfig
from pipeline.runtime.model.engine import Engine, StepInput, StepRows
from pipeline.runtime.spec_decode.base import Accepted, DecodingMethod, Sequence
from pipeline.runtime.spec_decode.parameters import TritonParameters
from pipeline.runtime.spec_decode.registry import Candidate, Measuring, MethodSettings, register
from pipeline.runtime.spec_decode.tree_verify import DraftTree, Proposal, verify

Pattern = tuple[int, ...]


@dataclass
class NGramPool:
    """Pattern -> the matches that followed it, oldest first.

    Example (K = 3 draft tokens, M = 2):

        >>> pool = NGramPool(max_draft_len=3, max_matching_ngram_size=2)
        >>> text = [7, 8, 9, 1, 7, 8]  # "7 8" occurred before, followed by "9 1 7"
        >>> pool.scan(text, since=0)  # the index the next scan of this text starts at
        2
        >>> pool.propose(text, room=10)
        [9, 1, 7]
        >>> pool.propose([5, 8], room=10)  # "8" alone matched: the longest tail that is a pattern
        [9, 1, 7]
        >>> pool.propose(text, room=2)  # no more than the request has room for
        [9, 1]
    """

    max_draft_len: int  # K
    max_matching_ngram_size: int  # M
    keep_all: bool = True
    use_oldest: bool = True
    matches: dict[Pattern, list[Pattern]] = field(default_factory=dict)

    def scan(self, tokens: list[int], since: int) -> int:
        """Take every pattern-match pair of ``tokens[since:]``; returns where the next scan of this text
        starts: the first token whose pairs may still grow (K + M - 1 from the end)."""
        new = tokens[since:]
        for size in range(min(self.max_matching_ngram_size, len(tokens) - 1), 0, -1):
            for start in range(len(new) - size):
                pattern = tuple(new[start : start + size])
                match = tuple(new[start + size : start + size + self.max_draft_len])
                self._add(pattern, match)
        return max(0, len(tokens) - (self.max_draft_len + self.max_matching_ngram_size - 1))

    def _add(self, pattern: Pattern, match: Pattern) -> None:
        kept = self.matches.get(pattern)
        if kept is None or (not self.keep_all and len(match) > len(kept[0])):
            self.matches[pattern] = [match]
        elif match not in kept:
            kept[:] = [m for m in kept if len(m) >= len(match)] + [match]

    def propose(self, tokens: list[int], room: int) -> list[int]:
        """The match of the longest tail of ``tokens`` (at most M) that is a pattern, cut to ``room``."""
        for size in range(min(self.max_matching_ngram_size, len(tokens) - 1), 0, -1):
            kept = self.matches.get(tuple(tokens[-size:]))
            if kept:
                return list(kept[0 if self.use_oldest else -1][: max(room, 0)])
        return []


@dataclass
class _State:
    pool: NGramPool  # the method's public pool, or this request's own
    scanned: int = 0  # where the next scan of this request's text starts
    proposal: Proposal | None = None


class NGramDecoding(DecodingMethod):
    name = "ngram"

    def __init__(self, engine: Engine, config: NGramConfig):
        built = engine.config.limits.max_draft_len
        if config.max_draft_len > built:
            raise InputError(
                f"ngram max_draft_len {config.max_draft_len} exceeds the engine's max_draft_len {built}; "
                "rebuild the engine from this plan or lower speculative.ngram.max_draft_len"
            )
        self.config = config
        self.max_draft_len = self.draft_positions = config.max_draft_len
        self.public = self._pool() if config.public_pool else None

    def _pool(self) -> NGramPool:
        c = self.config
        return NGramPool(c.max_draft_len, c.max_matching_ngram_size, c.keep_all, c.use_oldest)

    def accept(self, seq: Sequence, rows: StepRows, after_prefill: bool) -> Accepted:
        if after_prefill:
            seq.state[self.name] = _State(self.public or self._pool())
            return Accepted([seq.sample(rows.logits[-1])])
        state: _State = seq.state[self.name]  # type: ignore[assignment]
        proposal, state.proposal = state.proposal, None
        assert proposal is not None  # generation_input made it
        verdict = verify(proposal, rows, seq.cache, seq.sample)  # the target's greedy choice decides
        return Accepted(verdict.tokens, len(proposal.tree), verdict.accepted_drafts)

    def generation_input(self, seq: Sequence) -> StepInput:
        state: _State = seq.state[self.name]  # type: ignore[assignment]
        if state.proposal is None:
            tokens = seq.tokens  # the prompt and every committed token; the last is the root
            room = len(seq.request.input_ids) + seq.request.max_new_tokens - 1 - len(tokens)
            state.scanned = state.pool.scan(tokens, state.scanned)
            drafts = state.pool.propose(tokens, min(room, self.config.max_draft_len))
            state.proposal = Proposal.of_tree(seq.cache, tokens[-1], DraftTree.chain(drafts))
        return state.proposal.input


def _rehearsed(engine: Engine, pool: NGramConfig | None, measuring: Measuring) -> list[Candidate]:
    """The plan's pool, when it has one (it needs no weights of its own)."""
    if pool is None:
        return []
    k, m = pool.max_draft_len, pool.max_matching_ngram_size
    return [
        Candidate(
            f"ngram(k {k}, m {m})",
            "ngram",
            MethodSettings(ngram=pool),
            pool.drafting(),
            describe=f"NGram, {k} drafts from tails of up to {m}",
            max_draft_len=k,
        )
    ]


def _parameters(read: TritonParameters) -> dict[str, Any]:
    """The pool's settings (``reference_ngram_*``, TensorRT-LLM's defaults for those unset); K is the engine's."""
    if not read.has_any(NGRAM_TRITON_KEYS):
        return {}
    size_key, keep_key, oldest_key, public_key = NGRAM_TRITON_KEYS
    pool = NGramConfig(
        0,
        read.integer(size_key, 2) or 2,
        read.boolean(keep_key, True),
        read.boolean(oldest_key, True),
        read.boolean(public_key, True),
    )
    return {"ngram": pool}


@register("ngram", candidates=_rehearsed, parameters=_parameters)
def _from_settings(engine: Engine, settings: MethodSettings, warnings: list[str]) -> DecodingMethod:
    """K is the engine's; the pool's settings the server's, else TensorRT-LLM's defaults."""
    pool = settings.ngram or NGramConfig(0)
    k = pool.max_draft_len or engine.config.limits.max_draft_len
    return NGramDecoding(engine, dataclasses.replace(pool, max_draft_len=k))
