"""How one generation step of one request is fed and judged: the plug-in point for speculative methods.

The scheduler owns batching, limits, stopping and responses; a :class:`DecodingMethod` owns only
"which tokens go into the forward pass for this request" and "which tokens did that step
produce". Plain decoding feeds the last token and samples one. Medusa / EAGLE / Lookahead
(medusa.py, eagle.py, lookahead.py, sharing tree_verify.py) feed the last token plus a draft
tree with a tree mask, then keep the accepted path in the KV cache (``KVCache.keep``) and report
draft counts. :func:`make_method` picks the method from the engine and the Triton parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from pipeline import trees
from pipeline.errors import InputError
from pipeline.runtime.config import EngineConfig
from pipeline.runtime.engine import Engine, Logits, StepInput, StepRows
from pipeline.runtime.kv_cache import KVCache
from pipeline.runtime.request import GenerationRequest, RequestMetrics
from pipeline.runtime.sampling import make_generator, sample_one


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
        return sample_one(logits, self.request.sampling, self.generator)


@dataclass(frozen=True)
class Accepted:
    """Tokens one step produced for one request, in order (the last one is always the
    target model's own choice), and the draft counts behind acceptance_rate."""

    tokens: list[int]
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0


@dataclass(frozen=True)
class SpeculativeRequest(GenerationRequest):
    """A request with per-request speculative settings: Triton's optional ``lookahead_window_size``,
    ``lookahead_ngram_size`` and ``lookahead_verification_set_size`` inputs, as (w, n, g)."""

    lookahead: tuple[int, int, int] | None = None


class DecodingMethod(Protocol):
    """Required members. Optional ones, which the scheduler looks up with a plain-decoding default:

    * ``draft_positions: int``: deepest draft position (per-position metrics), default 0;
    * ``prompt_hidden: bool``: True when every prompt row's hidden state is needed (EAGLE's
      drafter reads the whole prompt; logits are still computed for the last row only), default False;
    * ``prompt_chunk(seq, rows)``: the rows of a prompt chunk that is not the last one (only with
      ``prompt_hidden``; the last chunk's rows go to ``accept(..., after_prefill=True)``);
    * ``problem(request) -> str | None``: a per-request error, answered before the request runs
      (Lookahead: per-request (w, n, g) beyond the server's);
    * ``propose(seqs)``: draft for every request about to run a generation step, in one batch
      (one heads GEMM / drafter pass for all requests); ``generation_input`` then only reads the
      proposal, and proposes alone when it was not called.
    """

    name: str
    max_draft_len: int  # extra KV-cache room a step may need beyond the committed tokens

    def generation_input(self, seq: Sequence) -> StepInput:
        """The forward-pass input of a generation step (the last token, plus drafts)."""
        ...

    def accept(self, seq: Sequence, rows: StepRows, after_prefill: bool) -> Accepted:
        """Judge the step's output rows; fix up the KV cache (drop rejected drafts). ``after_prefill``:
        the rows are the last prompt chunk's (logits of its last row; hidden states of that row, or of
        every row with ``prompt_hidden``)
        rather than generation_input's."""
        ...


class PlainDecoding:
    """One token per step, no drafts."""

    name = "plain"
    max_draft_len = 0

    def generation_input(self, seq: Sequence) -> StepInput:
        return StepInput(seq.cache, [seq.generated[-1]], Logits.LAST)

    def accept(self, seq: Sequence, rows: StepRows, after_prefill: bool) -> Accepted:
        return Accepted([seq.sample(rows.logits[-1])])


# Triton ``decoding_mode`` values (tensorrt_llm model parameter) that plain decoding serves.
PLAIN_MODES = ("", "top_k", "top_p", "top_k_top_p", "auto")
SPECULATIVE_MODES = ("medusa", "eagle", "lookahead", "redrafter", "explicit_draft_tokens")
DEFAULT_DYNAMIC_TREE_TOP_K = 10  # the spec's default for speculative.eagle.dynamic_tree_max_top_k
# build_config.speculative_decoding_mode: TensorRT-LLM's SpeculativeDecodingMode IntFlag, or its name.
_ENGINE_MODES = {1: None, 2: "draft_tokens_external", 4: "medusa", 8: "lookahead", 16: "explicit_draft_tokens",
                 32: "eagle", "none": None, "lookahead_decoding": "lookahead"}


@dataclass(frozen=True)
class MethodSettings:
    """What selects and shapes the method: the tensorrt_llm model's parameters (parsed in triton_io).

    ``eagle_dynamic_tree`` / ``eagle_dynamic_tree_max_top_k`` come from the reference-only
    parameters ``reference_eagle_use_dynamic_tree`` / ``reference_eagle_dynamic_tree_max_top_k``
    (the C++ backend exposes only eagle_choices and ignores keys it does not know).
    """

    decoding_mode: str | None = None
    medusa_choices: trees.Tree | None = None
    eagle_choices: trees.Tree | None = None
    lookahead: tuple[int, int, int] | None = None  # server (W, N, G)
    eagle_dynamic_tree: bool = False
    eagle_dynamic_tree_max_top_k: int | None = None


def engine_method(config: EngineConfig) -> str | None:
    """The speculative method the engine was built for (None: plain), from build_config."""
    mode = config.limits.speculative_decoding_mode
    key = mode.strip().lower() if isinstance(mode, str) else mode
    if key is None or key in ("", "none"):
        return None
    return _ENGINE_MODES.get(key, str(mode))


def make_method(engine: Engine, settings: MethodSettings = MethodSettings()) -> tuple[DecodingMethod, list[str]]:
    """The method for this engine and these parameters, and warnings to log.

    As TensorRT-LLM's executor: the engine's build mode decides (a different ``decoding_mode`` is
    overridden with a warning); an unknown or unsupported plain mode falls back to the default with
    a warning. What would fail on a GPU (a speculative mode on a plain engine, Lookahead without
    (W, N, G), a tree larger than the engine's max_draft_len) raises InputError at load.
    """
    mode = (settings.decoding_mode or "").strip().lower()
    built = engine_method(engine.config)
    where = engine.config.folder / "config.json"
    if built is None:
        if mode in ("medusa", "eagle", "lookahead"):
            raise InputError(f"decoding_mode {mode}, but {where} has no speculative_decoding_mode: the engine was "
                             f"built without {mode}; rebuild it from a {mode} plan or set decoding_mode top_k_top_p")
        if mode in PLAIN_MODES:
            return PlainDecoding(), []
        if mode in SPECULATIVE_MODES:
            return PlainDecoding(), [f"decoding_mode {mode} is not served by the reference backend; serving plain "
                                     "decoding (same greedy output, no draft tokens)"]
        if mode == "beam_search":
            return PlainDecoding(), ["decoding_mode beam_search: the reference backend serves beam width 1 only"]
        return PlainDecoding(), [f"decoding_mode {settings.decoding_mode!r} is not valid; using top_k_top_p"]
    warnings = []
    if mode not in ("", "auto", built):
        warnings.append(f"the engine is built for {built} but decoding_mode is {mode!r}; "
                        f"overwriting decoding_mode to {built} (as TensorRT-LLM does)")
    if built == "medusa":
        from pipeline.runtime.medusa import MedusaDecoding

        choices = settings.medusa_choices
        if choices is None:
            warnings.append("medusa_choices parameter is not specified; using the default mc_sim_7b_63 "
                            "(as TensorRT-LLM does)")
        return MedusaDecoding(engine, choices or trees.MC_SIM_7B_63), warnings
    if built == "eagle":
        from pipeline.runtime.eagle import EagleDecoding

        if settings.eagle_dynamic_tree and settings.eagle_choices is not None:
            raise InputError("eagle_choices and reference_eagle_use_dynamic_tree are mutually exclusive "
                             "(EAGLE-2 builds its own tree); drop one of them")
        if settings.eagle_dynamic_tree:
            top_k = settings.eagle_dynamic_tree_max_top_k or DEFAULT_DYNAMIC_TREE_TOP_K
            return EagleDecoding(engine, dynamic_top_k=top_k), warnings
        if settings.eagle_choices is None:
            warnings.append("eagle_choices parameter is not specified; using the default mc_sim_7b_63 "
                            "(as TensorRT-LLM does)")
        return EagleDecoding(engine, tree=settings.eagle_choices or trees.MC_SIM_7B_63), warnings
    if built == "lookahead":
        from pipeline.runtime.lookahead import LookaheadDecoding

        if settings.lookahead is None:
            raise InputError(f"{where} is a Lookahead engine but lookahead_window_size, lookahead_ngram_size and "
                             "lookahead_verification_set_size are not set (decoding_mode lookahead needs all three)")
        return LookaheadDecoding(engine, settings.lookahead), warnings
    raise InputError(f"{where}: speculative_decoding_mode {built} is not supported by the reference backend "
                     "(medusa, eagle, lookahead)")
