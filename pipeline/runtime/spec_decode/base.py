"""How one generation step of one request is fed and judged: the plug-in point for speculative methods.

The scheduler (serving/) owns batching, limits, stopping and responses; a :class:`DecodingMethod`
owns only "which tokens go into the forward pass for this request" and "which tokens did that
step produce". Plain decoding feeds the last token and samples one. Medusa / EAGLE / Lookahead
(medusa.py, eagle/, lookahead.py, sharing tree_verify.py) feed the last token plus a draft tree
with a tree mask, then keep the accepted path in the KV cache (``KVCache.keep``) and report draft
counts. ``factory.make_method`` picks the method from the engine and the Triton parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline.runtime.model.engine import Logits, StepInput, StepRows
from pipeline.runtime.model.kv_cache import KVCache
from pipeline.runtime.request import GenerationRequest, RequestMetrics
from pipeline.runtime.sampling import adjust_logits, log_prob, make_generator, sample_one


@dataclass
class Sequence:
    """A request being served: its cache, its tokens so far, its RNG and its counters."""

    key: int  # unique inside the scheduler (Triton request ids may repeat or be empty)
    request: GenerationRequest
    cache: KVCache
    generator: torch.Generator
    metrics: RequestMetrics
    prefilled: int = 0  # prompt tokens already in the cache
    generated: list[int] = field(default_factory=list)
    state: dict[str, object] = field(default_factory=dict)  # a method's own per-request data
    # Tokens chosen by ``sample`` this step, in order (a speculative step chooses one per accepted
    # position): the penalties of a later position see the earlier ones. The scheduler takes them.
    chosen: list[int] = field(default_factory=list)
    chosen_log_probs: list[float] = field(default_factory=list)
    chosen_logits: list[np.ndarray] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)  # of ``generated`` (return_log_probs)
    generation_logits: list[np.ndarray] = field(default_factory=list)  # of ``generated``

    @classmethod
    def create(cls, key: int, request: GenerationRequest, cache: KVCache, metrics: RequestMetrics) -> Sequence:
        return cls(key, request, cache, make_generator(request.sampling), metrics)

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < len(self.request.input_ids)

    @property
    def tokens(self) -> list[int]:
        return [*self.request.input_ids, *self.generated]

    def sample(self, logits: torch.Tensor) -> int:
        """The target model's choice at the next position: every emitted token comes from here."""
        request, params = self.request, self.request.sampling
        if request.return_generation_logits:  # the model's own logits, before any adjustment
            self.chosen_logits.append(logits.detach().float().numpy().copy())
        if params.adjusts(len(self.generated) + len(self.chosen), request.end_id):
            context = [*self.request.input_ids, *self.generated, *self.chosen]
            logits = adjust_logits(logits, params, context, len(self.generated) + len(self.chosen), request.end_id)
        token = sample_one(logits, params, self.generator)
        if request.return_log_probs:
            self.chosen_log_probs.append(log_prob(logits, token, params))
        self.chosen.append(token)
        return token


@dataclass(frozen=True)
class Accepted:
    """Tokens one step produced for one request, in order (the last one is always the
    target model's own choice), and the draft counts behind acceptance_rate."""

    tokens: list[int]
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0


class DecodingMethod:
    """A decoding method: what one generation step of one request feeds, and what it produced.

    Subclasses implement :meth:`generation_input` and :meth:`accept`; every other member has the
    plain-decoding default here, so the scheduler calls them all without asking what it serves.
    """

    name: str = "plain"
    max_draft_len: int = 0  # extra KV-cache room a step may need beyond the committed tokens
    draft_positions: int = 0  # deepest draft position (per-position acceptance metrics)
    # True when every prompt row's hidden state is needed (EAGLE's drafter reads the whole prompt;
    # logits are still computed for the last row only).
    prompt_hidden: bool = False
    # Target layers whose outputs every prompt row also returns (StepRows.captured; EAGLE-3's drafter
    # fuses them); a method's generation_input asks for its own.
    capture_layers: tuple[int, ...] = ()

    def problem(self, request: GenerationRequest) -> str | None:
        """A per-request error, answered before the request runs (Lookahead: per-request (w, n, g)
        beyond the server's)."""
        return None

    def propose(self, seqs: list[Sequence]) -> None:
        """Draft for every request about to run a generation step, in one batch (one heads GEMM or
        drafter pass for all of them); ``generation_input`` then only reads the proposal, and
        proposes alone when this was not called."""

    def prompt_chunk(self, seq: Sequence, rows: StepRows) -> None:
        """The rows of a prompt chunk that is not the last one (called only with ``prompt_hidden``;
        the last chunk's rows go to ``accept(..., after_prefill=True)``)."""

    def generation_input(self, seq: Sequence) -> StepInput:
        """The forward-pass input of a generation step (the last token, plus drafts)."""
        raise NotImplementedError

    def accept(self, seq: Sequence, rows: StepRows, after_prefill: bool) -> Accepted:
        """Judge the step's output rows; fix up the KV cache (drop rejected drafts). ``after_prefill``:
        the rows are the last prompt chunk's (logits of its last row; hidden states of that row, or of
        every row with ``prompt_hidden``) rather than generation_input's."""
        raise NotImplementedError


class PlainDecoding(DecodingMethod):
    """One token per step, no drafts."""

    def generation_input(self, seq: Sequence) -> StepInput:
        return StepInput(seq.cache, [seq.generated[-1]], Logits.LAST)

    def accept(self, seq: Sequence, rows: StepRows, after_prefill: bool) -> Accepted:
        return Accepted([seq.sample(rows.logits[-1])])
