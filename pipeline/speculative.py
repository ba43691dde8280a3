"""Resolved speculative-decoding settings and the numbers TensorRT-LLM 1.2 derives from them.

These dataclasses are what the plan carries to every later stage: the converter, the
trtllm-build argv, the engine config and the Triton parameters all read ``max_draft_len``
and friends from here, so build-time and serve-time values cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from pipeline import trees

Method = Literal["medusa", "eagle", "lookahead", "none"]

# tensorrt_llm.models.modeling_utils.SpeculativeDecodingMode (an IntFlag, stored in the engine's
# build_config as its int), by trtllm-build's --speculative_decoding_mode value (None: no speculation).
SPECULATIVE_DECODING_MODES: dict[str | None, int] = {
    None: 1,  # NONE
    "draft_tokens_external": 2,
    "medusa": 4,
    "lookahead_decoding": 8,
    "explicit_draft_tokens": 16,
    "eagle": 32,
}

# The Triton tensorrt_llm model's decoding_mode values (TensorRT-LLM executor's DecodingMode names):
# those plain decoding serves, and the speculative ones.
TRITON_PLAIN_DECODING_MODES = ("", "top_k", "top_p", "top_k_top_p", "auto")
TRITON_SPECULATIVE_DECODING_MODES = ("medusa", "eagle", "lookahead", "redrafter", "explicit_draft_tokens")


@dataclass(frozen=True)
class MethodIdentity:
    """How one method is spelled at each stage, from spec to runtime."""

    build_mode: str | None  # trtllm-build --speculative_decoding_mode (None: the flag is not passed)
    triton_decoding_mode: str  # the tensorrt_llm model's decoding_mode parameter

    @property
    def engine_mode(self) -> int:
        """build_config.speculative_decoding_mode in the engine's config.json."""
        return SPECULATIVE_DECODING_MODES[self.build_mode]

    @property
    def speculative(self) -> bool:
        return self.build_mode is not None


# The one table of method identity.
METHODS: dict[Method, MethodIdentity] = {
    "medusa": MethodIdentity("medusa", "medusa"),
    "eagle": MethodIdentity("eagle", "eagle"),
    "lookahead": MethodIdentity("lookahead_decoding", "lookahead"),
    "none": MethodIdentity(None, "top_k_top_p"),
}


def engine_mode_method(mode: int | str | None) -> str:
    """The method an engine was built for, from its build_config.speculative_decoding_mode (the
    IntFlag's int, or a build-mode name); a mode no method has comes back as its name."""
    if mode is None or isinstance(mode, str) and mode.strip().lower() in ("", "none"):
        return "none"
    if isinstance(mode, str):
        build_mode: str | None = mode.strip().lower()
    else:
        names = [name for name, value in SPECULATIVE_DECODING_MODES.items() if value == mode]
        if not names:
            return str(mode)
        build_mode = names[0]
    return next((method for method, ident in METHODS.items() if ident.build_mode == build_mode), str(build_mode))


EAGLE_MAX_DRAFT_LEN = 256  # builder.py asserts max_draft_len <= 256 for EAGLE
EAGLE_MAX_BATCH_SIZE = 512  # builder.py asserts max_batch_size <= 512 for EAGLE


def lookahead_max_draft_len(window: int, ngram: int, verification_set: int) -> int:
    """Draft tokens per step for Lookahead (W, N, G), as TensorRT-LLM computes it.

    ``(0 if N == 1 else N - 2) + (W - 1 + G) * (N - 1)``: the lookahead branch keeps
    W-1 Jacobi positions of N-1 tokens each, the verification branch G candidate n-grams
    of N-1 tokens, plus N-2 tokens of the current n-gram
    (executor/decodingConfig.cpp, ``calculateSpeculativeResourceTuple``).
    """
    return (0 if ngram == 1 else ngram - 2) + (window - 1 + verification_set) * (ngram - 1)


def lookahead_problem(window: int, ngram: int, verification_set: int) -> str | None:
    """None if (W, N, G) is legal for TensorRT-LLM, else why not."""
    if window < 1 or ngram < 1 or verification_set < 0:
        return "needs window >= 1, ngram >= 1, verification_set >= 0"
    if ngram == 1 and (window != 1 or verification_set != 0):
        return "ngram 1 means plain decoding and needs window 1 and verification_set 0"
    return None


def eagle_dynamic_tree_size(top_k: int, num_eagle_layers: int) -> int:
    """Nodes an EAGLE-2 dynamic tree can produce before the max_draft_len cap:
    top_k at the first layer, then top_k expansions of top_k kept nodes per further layer."""
    return top_k + top_k * top_k * (num_eagle_layers - 1)


@dataclass(frozen=True)
class MedusaConfig:
    num_heads: int
    num_layers: int
    tree: trees.Tree
    max_draft_len: int


@dataclass(frozen=True)
class EagleConfig:
    tree: trees.Tree | None  # None with a dynamic tree
    num_eagle_layers: int
    max_non_leaves_per_layer: int
    max_draft_len: int
    dynamic_tree: bool
    dynamic_tree_max_top_k: int


@dataclass(frozen=True)
class LookaheadConfig:
    """Lookahead's (W, N, G), one type from the spec to the runtime (a request's (w, n, g) too)."""

    window: int  # W: Jacobi window positions
    ngram: int  # N: n-gram size
    verification_set: int  # G: candidate n-grams verified per step

    def __iter__(self) -> Iterator[int]:
        """``w, n, g = config``."""
        return iter((self.window, self.ngram, self.verification_set))

    @property
    def max_draft_len(self) -> int:
        return lookahead_max_draft_len(self.window, self.ngram, self.verification_set)


@dataclass(frozen=True)
class SpeculativeConfig:
    method: Method
    reason: str
    medusa: MedusaConfig | None = None
    eagle: EagleConfig | None = None
    lookahead: LookaheadConfig | None = None

    @property
    def max_draft_len(self) -> int:
        for config in (self.medusa, self.eagle, self.lookahead):
            if config is not None:
                return config.max_draft_len
        return 0

    @property
    def build_mode(self) -> str | None:
        return METHODS[self.method].build_mode
