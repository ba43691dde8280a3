"""Lookahead decoding (arXiv 2402.02057): Jacobi iterations feed an n-gram pool; pool n-grams are verified.

No extra weights. Each step feeds, in ONE forward pass after the root (the last chosen token, at
position P):

* the lookahead branch, a window of N-1 levels x W columns; level 0 is [root, W-1 guesses],
  i.e. a Jacobi guess of positions P..P+W-1, and level l column i sits at P+i+l. Token (l, i)
  attends to level 0 columns 0..i and to levels 1..l-1 of its own column: the model's output
  at (N-2, i) extends the column into an N-gram (level 0..N-2 of column i, then that output);
* the verification branch: up to G n-grams from the pool that start with the root, merged into
  a trie (TensorRT-LLM's treeEncode does the same), each node seeing the root and its trie
  ancestors; it never sees the window and the window never sees it.

After the step the accepted trie path is kept in the KV cache (tree_verify), the window slides
one level (levels 1.. move down, the top level's outputs become the new top level, and the new
root replaces level 0 column 0), and the pool takes the window's n-grams plus the n-grams ending
in newly committed tokens (TensorRT-LLM's pool, ``LookaheadPoolManager``: per first token at most
G n-grams, most recent kept, seeded with the prompt's n-grams; the window starts as random prompt
tokens from a generator seeded with the request's seed, so the request's sampling RNG is untouched).

Per request (w, n, g) may be set with Triton's lookahead_* inputs, each at most the server's
(W, N, G); (1, 1, 0) is plain decoding. The engine's max_draft_len must be
``(0 if N == 1 else N - 2) + (W - 1 + G) * (N - 1)``, as TensorRT-LLM asserts at load.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from pipeline.errors import InputError
from pipeline.methods.drafting import Drafting
from pipeline.methods.lookahead import LOOKAHEAD_TRITON_KEYS, LookaheadConfig, lookahead_problem
from pipeline.runtime.model.engine import Engine, Logits, StepInput, StepRows
from pipeline.runtime.request import GenerationRequest
from pipeline.runtime.spec_decode.base import Accepted, DecodingMethod, Sequence
from pipeline.runtime.spec_decode.parameters import TritonParameters
from pipeline.runtime.spec_decode.registry import Candidate, Measuring, MethodSettings, register
from pipeline.runtime.spec_decode.tree_verify import DraftTree, Proposal, verify


class NgramPool:
    """First token -> the most recent n-grams (their other n - 1 tokens) that start with it."""

    def __init__(self, n: int, capacity: int):
        self.n, self.capacity = n, max(capacity, 1)
        self.by_key: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def insert(self, key: int, rest: tuple[int, ...]) -> None:
        entries = self.by_key.setdefault(key, OrderedDict())
        entries.pop(rest, None)  # re-inserting makes it the most recent
        entries[rest] = None
        if len(entries) > self.capacity:
            entries.popitem(last=False)

    def add(self, tokens: list[int]) -> None:
        """Every n-gram of ``tokens``."""
        for i in range(len(tokens) - self.n + 1):
            self.insert(tokens[i], tuple(tokens[i + 1 : i + self.n]))

    def guess(self, key: int, count: int) -> list[tuple[int, ...]]:
        """Up to ``count`` n-grams after ``key``, most recent first."""
        return list(reversed(self.by_key.get(key, {})))[:count]


@lru_cache(maxsize=64)
def window_layout(w: int, n: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(mask [w(n-1), w(n-1)], position offsets from the root) of the lookahead branch.

    Fed order: level by level, column by column, so token (l, i) is at l * w + i and the root
    (0, 0) comes first.
    """
    size = w * (n - 1)
    mask = torch.zeros(size, size, dtype=torch.bool)
    offsets = []
    for level in range(n - 1):
        for col in range(w):
            row = level * w + col
            mask[row, : col + 1] = True  # level 0, columns 0..i: the Jacobi guess up to this column
            for lower in range(1, level + 1):  # this column's levels 1..l (itself included)
                mask[row, lower * w + col] = True
            offsets.append(col + level)
    return mask, tuple(offsets)


def trie(ngrams: list[tuple[int, ...]]) -> DraftTree:
    """The n-grams' tokens after the root as a prefix tree (shared prefixes verified once)."""
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for gram in ngrams:
        parent = -1
        for token in gram:
            if (parent, token) not in index:
                index[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
            parent = index[(parent, token)]
    return DraftTree(tuple(tokens), tuple(parents))


@dataclass
class _State:
    config: LookaheadConfig
    pool: NgramPool
    levels: list[list[int]]  # n - 1 levels of w tokens; levels[0][0] is the root
    warm: int = 0  # steps so far: window n-grams count once every level holds model outputs
    proposal: Proposal | None = None


class LookaheadDecoding(DecodingMethod):
    name = "lookahead"

    def __init__(self, engine: Engine, config: LookaheadConfig):
        problem = lookahead_problem(*config)
        if problem:
            raise InputError(f"lookahead (W, N, G) = {tuple(config)} is not legal: {problem}")
        need, built = config.max_draft_len, engine.config.limits.max_draft_len
        if need != built:
            raise InputError(
                f"lookahead (W, N, G) = {tuple(config)} needs max_draft_len {need} but the engine was "
                f"built with {built}; the server's lookahead_* parameters must match the build "
                "(tensorrtllm_backend#710)"
            )
        self.config = config
        self.max_draft_len = need
        self.draft_positions = config.ngram - 1

    def request_config(self, request: GenerationRequest) -> LookaheadConfig:
        return request.lookahead or self.config

    def problem(self, request: GenerationRequest) -> str | None:
        w, n, g = self.request_config(request)
        problem = lookahead_problem(w, n, g)
        if problem:
            return f"lookahead (w, n, g) = ({w}, {n}, {g}) is not legal: {problem}"
        W, N, G = self.config
        if w > W or n > N or g > G:
            return (
                f"lookahead (w, n, g) = ({w}, {n}, {g}) exceeds the server's (W, N, G) = ({W}, {N}, {G}); "
                "each must be at most the server's"
            )
        return None

    def accept(self, seq: Sequence, rows: StepRows, after_prefill: bool) -> Accepted:
        if after_prefill:
            root = seq.sample(rows.logits[-1])
            seq.state[self.name] = self._start(seq, root)
            return Accepted([root])
        state: _State = seq.state[self.name]  # type: ignore[assignment]
        proposal, state.proposal = state.proposal, None
        assert proposal is not None  # generation_input made it
        verdict = verify(proposal, rows, seq.cache, seq.sample)
        w, n, g = state.config
        if n > 1:
            top = rows.logits[(n - 2) * w : (n - 1) * w]  # the top level's rows (fed level by level)
            outputs = top.argmax(-1).tolist()  # Jacobi: greedy, whatever the request samples
            if state.warm >= n - 1:  # every window token is now a model output (or the root)
                for col in range(w):
                    state.pool.insert(
                        state.levels[0][col], tuple(lvl[col] for lvl in state.levels[1:]) + (outputs[col],)
                    )
            state.levels = state.levels[1:] + [outputs]
            state.levels[0][0] = verdict.tokens[-1]  # the next root
            state.warm += 1
            state.pool.add(seq.tokens[-(n - 1) :] + verdict.tokens)  # n-grams ending in committed tokens
        return Accepted(verdict.tokens, len(proposal.tree), verdict.accepted_drafts)

    def generation_input(self, seq: Sequence) -> StepInput:
        state: _State = seq.state[self.name]  # type: ignore[assignment]
        if state.proposal is None:
            state.proposal = self._propose(seq, state)
        return state.proposal.input

    def _start(self, seq: Sequence, root: int) -> _State:
        w, n, g = config = self.request_config(seq.request)
        prompt = list(seq.request.input_ids)
        pool = NgramPool(n, g)
        pool.add(prompt + [root])
        rng = torch.Generator().manual_seed(seq.request.sampling.seed & 0xFFFF_FFFF_FFFF_FFFF)
        picks = torch.randint(len(prompt), (max(n - 1, 0), w), generator=rng).tolist()
        levels = [[prompt[i] for i in row] for row in picks]
        if levels:
            levels[0][0] = root
        return _State(config, pool, levels)

    def _propose(self, seq: Sequence, state: _State) -> Proposal:
        w, n, g = state.config
        root, past = seq.generated[-1], seq.cache.length
        tree = trie(state.pool.guess(root, g)) if n > 1 else DraftTree((), ())
        if n == 1:  # (1, 1, 0): plain decoding
            return Proposal(StepInput(seq.cache, [root], Logits.ALL), tree, past)
        window, offsets = window_layout(w, n)
        size, nodes = len(offsets), len(tree)
        mask = torch.zeros(size + nodes, size + nodes, dtype=torch.bool)
        mask[:size, :size] = window
        among = tree.mask()  # root + trie nodes; place the nodes after the window
        mask[size:, 0] = among[1:, 0]
        mask[size:, size:] = among[1:, 1:]
        tokens = [tok for level in state.levels for tok in level] + list(tree.tokens)
        tokens[0] = root  # level 0 column 0 is always the root
        positions = [past + o for o in offsets] + [past + d for d in tree.depths()]
        return Proposal(StepInput(seq.cache, tokens, Logits.ALL, positions, mask), tree, past, offset=size)


def lookahead_sweep(spec: LookaheadConfig) -> list[LookaheadConfig]:
    """The spec's (W, N, G) and a smaller setting: half the window and verification set (legal ones only,
    at most the spec's: per-request limits). One smaller point, not more: on SmolLM2 the half-size
    setting and the one n-gram shorter (W, N - 1, G) measured the same acceptance (1.36 / 1.35) and step
    cost (2.47 / 2.45 plain steps) while each costs a sixth of the evaluation's time."""
    w, n, g = spec
    options = [spec, LookaheadConfig(max(1, w // 2), n, g // 2)]
    out: list[LookaheadConfig] = []
    for option in options:
        if option not in out and option.ngram >= 2 and lookahead_problem(*option) is None:
            out.append(option)
    return out


def _rehearsed(engine: Engine, server: LookaheadConfig | None, measuring: Measuring) -> list[Candidate]:
    """On any engine: the server's (W, N, G), and a smaller (w, n, g) per request on that server."""
    if server is None:
        return []
    listed = []
    for config in lookahead_sweep(server):
        w, n, g = config
        listed.append(
            Candidate(
                f"lookahead({w},{n},{g})",
                "lookahead",
                MethodSettings("lookahead", lookahead=server),
                Drafting.lookahead(config),
                config if config != server else None,
                f"(w, n, g) = ({w}, {n}, {g}) on a ({server.window}, {server.ngram}, {server.verification_set}) server",
                server.max_draft_len,
            )
        )
    return listed


def _parameters(read: TritonParameters) -> dict[str, Any]:
    """The server's (W, N, G): all three, or none (then decoding_mode lookahead fails at load)."""
    window, ngram, verification_set = (read.integer(key, None) for key in LOOKAHEAD_TRITON_KEYS)
    if window is not None and ngram is not None and verification_set is not None:
        return {"lookahead": LookaheadConfig(window, ngram, verification_set)}
    if read.get("decoding_mode") == "lookahead":
        raise InputError(
            "decoding_mode is lookahead but lookahead_window_size, lookahead_ngram_size and "
            "lookahead_verification_set_size are not all set"
        )
    return {}


@register("lookahead", candidates=_rehearsed, parameters=_parameters)
def _from_settings(engine: Engine, settings: MethodSettings, warnings: list[str]) -> DecodingMethod:
    """The server's (W, N, G): required (TensorRT-LLM fails at load without them)."""
    if settings.lookahead is None:
        raise InputError(
            f"{engine.config.folder / 'config.json'} is a Lookahead engine but "
            "lookahead_window_size, lookahead_ngram_size and lookahead_verification_set_size are not set "
            "(decoding_mode lookahead needs all three)"
        )
    return LookaheadDecoding(engine, settings.lookahead)
