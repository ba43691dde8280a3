"""Resolved speculative-decoding settings and the numbers TensorRT-LLM 1.2 derives from them.

These dataclasses are what the plan carries to every later stage: the converter, the
trtllm-build argv, the engine config and the Triton parameters all read ``max_draft_len``
and friends from here, so build-time and serve-time values cannot drift apart.

Each method's config and its ``check()`` (the TensorRT-LLM 1.2 rules it must meet, reported at
spec key paths, as vLLM's ``SpeculativeConfig`` validates itself) live with its definition in
:mod:`pipeline.methods`; the planner only orchestrates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline import methods
from pipeline.methods.drafting import Drafting
from pipeline.methods.eagle import EagleConfig
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.methods.medusa import MedusaConfig
from pipeline.methods.ngram import NGramConfig

Method = Literal["medusa", "eagle", "lookahead", "ngram", "none"]  # the names of pipeline.methods' definitions

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


def identity(method: str) -> MethodIdentity:
    """How ``method`` is spelled in the build and the runtime configuration (its definition's)."""
    found = methods.definition(method)
    return MethodIdentity(found.build_mode, found.triton_decoding_mode)


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
    return next((d.name for d in methods.definitions() if d.build_mode == build_mode), str(build_mode))


@dataclass(frozen=True)
class SpeculativeConfig:
    method: Method
    reason: str
    medusa: MedusaConfig | None = None
    eagle: EagleConfig | None = None
    lookahead: LookaheadConfig | None = None
    ngram: NGramConfig | None = None

    @property
    def max_draft_len(self) -> int:
        for config in (self.medusa, self.eagle, self.lookahead, self.ngram):
            if config is not None:
                return config.max_draft_len
        return 0

    def drafting(self) -> Drafting:
        """What a step of this method costs beyond the verification pass (the cost model's input)."""
        config = getattr(self, self.method, None)
        return Drafting.plain() if config is None else config.drafting()

    @property
    def build_mode(self) -> str | None:
        return methods.definition(self.method).build_mode
