"""What a client asks for and what it gets back, independent of Triton.

The Triton adapter (triton_backend.py) turns ``tensorrt_llm`` input tensors into a
:class:`GenerationRequest`; tests build them directly. Defaults follow TensorRT-LLM's executor
so the reference backend answers like the GPU one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from pipeline.errors import InputError
from pipeline.methods.lookahead import LookaheadConfig

TOP_K_MAX = 1024  # TensorRT-LLM clips runtime_top_k to this (samplingTopKKernels.h)
MIN_TOKENS_DEFAULT = 1  # TensorRT-LLM's DefaultDecodingParams::getMinLength()


@dataclass(frozen=True)
class SamplingParams:
    """TensorRT-LLM sampling semantics (``regularizeTopKTopP`` in samplingTopKKernels.h):

    * top_k = 0 and top_p = 0 (the defaults) mean greedy, i.e. top_k = 1;
    * top_k > 0 with top_p = 0 means top-k only (top_p = 1);
    * top_k is clipped to [0, 1024], top_p to [0, 1];
    * seed defaults to 0, so unseeded sampling is reproducible, as on the GPU backend.
    temperature 0 is taken as greedy (a division by zero otherwise).

    Out-of-range values are refused per request, as the executor's ``SamplingConfig`` checks
    (samplingConfig.cpp): temperature >= 0, top_k >= 0, top_p <= 1 (0 stands for "not given",
    which the Triton backend sends as its default), and NaN nowhere.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    seed: int = 0
    # Applied to the target model's logits before the choice (sampling.adjust_logits), so
    # speculative verification compares drafts with the adjusted choice and stays lossless.
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # end_id is banned until this many tokens were generated. TensorRT-LLM's default is 1 (SamplingConfig:
    # "Values < 1 have no effect. Default is 1"), and 1 bans nothing: its penalty layer passes the kernel
    # no min lengths when every request has the default (penaltyLayer.cpp, GET_PENALTIES against
    # DefaultDecodingParams::getMinLength() == 1), so the end id may be the first token, as in transformers.
    # (In a step where another request has min_tokens > 1, TensorRT-LLM's kernel bans it at the first
    # step for the default ones too; here a request's tokens never depend on its batch.)
    min_tokens: int = MIN_TOKENS_DEFAULT
    bad_words: tuple[tuple[int, ...], ...] = ()
    embedding_bias: tuple[float, ...] = ()  # added to the logits of ids 0..len-1
    # Beam search (serving/beam_search.py), TensorRT-LLM's defaults (DefaultDecodingParams):
    # score = cum_log_prob / generated_length ** length_penalty (0: no normalisation); early_stopping
    # 1 stops once beam_width hypotheses ended, 0 when no alive beam can beat them (HF's heuristic),
    # other values never; beam_search_diversity_rate * beam index is added when ranking candidates.
    beam_width: int = 1
    length_penalty: float = 0.0
    early_stopping: int = 1
    beam_search_diversity_rate: float = 0.0

    @property
    def adjusts_logits(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or bool(self.bad_words)
            or bool(self.embedding_bias)
        )

    def bans_end_id(self, generated: int, end_id: int | None) -> bool:
        """Whether ``end_id`` is banned for the next token (after ``generated`` ones): only below a
        min_tokens above TensorRT-LLM's default 1, which its penalty layer skips."""
        return end_id is not None and self.min_tokens > MIN_TOKENS_DEFAULT and generated < self.min_tokens

    def adjusts(self, generated: int, end_id: int | None) -> bool:
        """Whether the logits of the next token (after ``generated`` ones) are adjusted at all."""
        return self.adjusts_logits or self.bans_end_id(generated, end_id)

    def __post_init__(self) -> None:
        checks = (
            ("temperature", self.temperature, self.temperature >= 0.0, ">= 0 (0 is greedy)"),
            ("runtime_top_k", self.top_k, self.top_k >= 0, ">= 0 (0 means not set)"),
            ("runtime_top_p", self.top_p, 0.0 <= self.top_p <= 1.0, "in (0, 1] (0 means not set)"),
        )
        for name, value, ok, allowed in checks:
            if not ok:  # NaN fails every comparison
                raise InputError(
                    f"{name}={value:g} is out of range: must be {allowed}, as TensorRT-LLM's executor requires"
                )

    def regularized(self) -> tuple[int, float]:
        """(top_k, top_p) after TensorRT-LLM's clipping and defaulting."""
        top_k = min(max(self.top_k, 0), TOP_K_MAX)
        top_p = min(max(self.top_p, 0.0), 1.0)
        if top_k == 0 and top_p == 0.0:
            top_k = 1
        if top_k > 0 and top_p == 0.0:
            top_p = 1.0
        return top_k, top_p

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.regularized()[0] == 1


@dataclass(frozen=True, eq=False)
class LoraRequest:
    """A request's LoRA inputs (Triton's lora_task_id, lora_weights, lora_config): the first request of
    a task id may carry the adapter (weights [1, rows, width], config [1, rows, 3] int32), later ones
    the id alone (TensorRT-LLM's LoRA cache semantics)."""

    task_id: int
    weights: np.ndarray | None = None
    config: np.ndarray | None = None


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    input_ids: tuple[int, ...]
    max_new_tokens: int  # request_output_len
    end_id: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()
    sampling: SamplingParams = SamplingParams()
    pad_id: int | None = None  # only checked (the reference backend pads nothing with it)
    streaming: bool = False
    exclude_input_in_output: bool = False
    return_perf_metrics: bool = False
    return_log_probs: bool = False  # output_log_probs / cum_log_probs of the generated tokens
    return_generation_logits: bool = False  # the target's logits row behind each generated token
    return_context_logits: bool = False  # the prompt's logits (needs gather_context_logits engines)
    # Triton's optional lookahead_window_size / _ngram_size / _verification_set_size inputs:
    # this request's (w, n, g), each at most the server's (W, N, G).
    lookahead: LookaheadConfig | None = None
    # Beam search: how many of the best beams the response carries (num_return_sequences, at most
    # beam_width: TensorRT-LLM's SamplingConfig::getNumReturnBeams); None: all beam_width of them.
    num_return_beams: int | None = None
    lora: LoraRequest | None = None  # the fine-tune to run through (None: the base model)


class FinishReason(str, Enum):
    LENGTH = "length"  # max_new_tokens reached (or max_seq_len)
    END_ID = "end_id"
    STOP_WORDS = "stop_words"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass
class RequestMetrics:
    """Per-request counters; the speculative fields stay 0 for plain decoding.

    acceptance_rate = total_accepted_draft_tokens / total_draft_tokens (0.0 when no draft token
    was proposed), the definition TensorRT-LLM's ``acceptance_rate`` output uses.
    """

    arrival_time_ns: int = 0
    first_scheduled_time_ns: int = 0
    first_token_time_ns: int = 0
    last_token_time_ns: int = 0
    forward_steps: int = 0  # forward passes that produced tokens: the one ending prefill, then verification steps
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    # KV-cache blocks of tokens_per_block tokens (TensorRT-LLM's kv_cache_alloc_* outputs): newly
    # allocated for this request, and reused from other requests (no prefix reuse here: 0).
    kv_cache_alloc_new_blocks: int = 0
    kv_cache_reused_blocks: int = 0

    @property
    def acceptance_rate(self) -> float:
        if self.total_draft_tokens == 0:
            return 0.0
        return self.total_accepted_draft_tokens / self.total_draft_tokens


@dataclass(frozen=True)
class BeamOutput:
    """One finished beam of a beam-search request: its generated tokens (without the end id), their
    log-probabilities and their sum (TensorRT-LLM's output_log_probs / cum_log_probs per beam), and with
    return_generation_logits the logits row behind each of its tokens, along the beam's own history."""

    tokens: tuple[int, ...]
    log_probs: tuple[float, ...]
    cum_log_prob: float
    generation_logits: tuple[np.ndarray, ...] = ()


@dataclass
class StepOutput:
    """One response to one request.

    ``tokens`` is what the response carries: with streaming, the tokens of this step only;
    without, the whole output (prompt + generated, or generated only when
    ``exclude_input_in_output``), sent once. ``finished`` marks the request's last response.
    """

    request_id: str
    tokens: list[int]
    finished: bool
    reason: FinishReason | None = None
    error: str | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    # With return_log_probs: the log-probabilities of the generated tokens this response carries,
    # and their sum over every token generated so far (TensorRT-LLM's cum_log_probs).
    log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float = 0.0
    generation_logits: list[np.ndarray] = field(default_factory=list)  # [vocab] each, with log_probs' tokens
    # Beam search: the beams, best first (``tokens`` then holds beam 0 as sent). Every response of
    # a beam-search request carries whole beams, since a step may reorder them (as TensorRT-LLM).
    beams: list[BeamOutput] | None = None
    context_logits: np.ndarray | None = None  # [prompt_len, vocab], in the final response only


def parse_words_list(
    rows: Sequence[Sequence[int]] | np.ndarray, what: str = "stop_words_list"
) -> tuple[tuple[int, ...], ...]:
    """TensorRT-LLM's [2, L] words format -> a tuple of token sequences.

    Row 0 holds all words' tokens back to back, row 1 each word's *end* offset into row 0,
    padded with -1: [[5, 6, 7], [2, 3, -1]] is the words (5, 6) and (7,).
    """
    if len(rows) != 2:
        raise InputError(f"{what} must have shape [2, L] (tokens row, offsets row), got {len(rows)} rows")
    tokens, offsets = [int(t) for t in rows[0]], [int(o) for o in rows[1]]
    words: list[tuple[int, ...]] = []
    start = 0
    for end in offsets:
        if end < 0:
            break
        if end < start or end > len(tokens):
            raise InputError(f"{what}: offset {end} is out of order or past the {len(tokens)} tokens")
        if end > start:
            words.append(tuple(tokens[start:end]))
        start = end
    return tuple(words)


def ends_with_stop_word(
    prompt: Sequence[int], generated: Sequence[int], stop_words: tuple[tuple[int, ...], ...]
) -> bool:
    """Does prompt + generated end with a stop word? A word may start inside the prompt, as in TensorRT-LLM's
    ``stopWordsCriterion`` (cpp/tensorrt_llm/kernels/stopCriteriaKernels.cu), which matches the whole
    sequence (for a beam: its own history, gathered through the parent ids). Only the tail is built."""
    if not stop_words:
        return False
    longest = max(len(word) for word in stop_words)
    tail = (list(prompt[-longest:]) + list(generated[-longest:]))[-longest:]
    return any(len(word) <= len(tail) and tuple(tail[-len(word) :]) == word for word in stop_words)
