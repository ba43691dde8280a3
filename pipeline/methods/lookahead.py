"""Lookahead decoding (Fu et al., arXiv 2402.02057): Jacobi iteration over a window of future
positions collects n-grams, and cached n-grams that continue the text are verified in the same pass.

Needs no extra weights; runs on the engine target and the reference backend; the reference
runtime's loop is :class:`pipeline.runtime.spec_decode.lookahead.LookaheadDecoding`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.methods.base import ENGINE_TARGETS, MethodDefinition, Problems
from pipeline.methods.drafting import Drafting

if TYPE_CHECKING:
    from pipeline.spec.document import VariantSpec


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


# Triton's spelling of (W, N, G): the tensorrt_llm model's parameters and its optional per-request
# inputs use the same three names (the preprocessing model, which imports nothing of the project,
# has its own copy).
LOOKAHEAD_TRITON_KEYS = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")


@dataclass(frozen=True)
class LookaheadConfig:
    """Lookahead's (W, N, G), one type from the spec to the runtime (a request's (w, n, g) too)."""

    window: int  # W: Jacobi window positions
    ngram: int  # N: n-gram size
    verification_set: int  # G: candidate n-grams verified per step

    def __iter__(self) -> Iterator[int]:
        """``w, n, g = config``."""
        return iter((self.window, self.ngram, self.verification_set))

    def describe(self) -> str:
        """One line for the plan: ``lookahead: W=4 N=3 G=4``."""
        return f"lookahead: W={self.window} N={self.ngram} G={self.verification_set}"

    def triton_parameters(self) -> dict[str, str]:
        """``{"lookahead_window_size": "W", ...}``: the model-config parameters of these values (all three
        or the C++ backend throws; equal to the engine's build or it asserts at load, tensorrtllm_backend#710)."""
        return dict(zip(LOOKAHEAD_TRITON_KEYS, map(str, self)))

    @property
    def max_draft_len(self) -> int:
        return lookahead_max_draft_len(self.window, self.ngram, self.verification_set)

    def drafting(self) -> Drafting:
        """What a step of (W, N, G) costs beyond the verification pass: its rows only."""
        return Drafting.lookahead(self)

    @classmethod
    def check(cls, variant: VariantSpec, problems: Problems) -> LookaheadConfig | None:
        """The Lookahead (W, N, G) of ``variant``, or None when TensorRT-LLM would refuse it."""
        settings = variant.speculative.lookahead
        problem = lookahead_problem(settings.window, settings.ngram, settings.verification_set)
        if problem:
            problems.error(
                ("speculative", "lookahead"),
                f"(W={settings.window}, N={settings.ngram}, G={settings.verification_set}) is not legal: {problem}",
            )
            return None
        expected = lookahead_max_draft_len(settings.window, settings.ngram, settings.verification_set)
        if settings.max_draft_len is not None and settings.max_draft_len != expected:
            problems.error(
                ("speculative", "lookahead", "max_draft_len"),
                f"{settings.max_draft_len} does not match (W={settings.window}, N={settings.ngram}, "
                f"G={settings.verification_set}), which needs {expected}; the engine and the server "
                "must agree (tensorrtllm_backend#710); remove max_draft_len or fix it",
            )
        return cls(settings.window, settings.ngram, settings.verification_set)


def resolve(
    variant: VariantSpec, arch: ModelGeometry, heads_dir: Path | None, problems: Problems
) -> LookaheadConfig | None:
    return LookaheadConfig.check(variant, problems)


def measured(build: dict[str, Any], built: LookaheadConfig | None) -> LookaheadConfig | None:
    """A measured (w, n, g) needs no extra weights: any recorded one can be built."""
    return LookaheadConfig(*build["lookahead"]) if build.get("lookahead") else None


def served_settings(settings: Any, pretrained: dict[str, Any], where: Path) -> dict[str, Any]:
    """The server's (W, N, G): a Lookahead engine is served with them or not at all."""
    if settings.lookahead is None:
        raise InputError(f"{where}: a Lookahead engine without lookahead_* parameters")
    return {"lookahead": list(settings.lookahead)}


def served_drafting(settings: dict[str, Any]) -> Drafting:
    return Drafting.lookahead(LookaheadConfig(*settings["lookahead"]))


def recorded(candidate: Any) -> dict[str, Any]:
    """The measured (w, n, g): the candidate's per-request setting, else the server's."""
    look = candidate.lookahead or candidate.settings.lookahead
    return {"lookahead": list(look) if look is not None else None}


DEFINITION = MethodDefinition(
    name="lookahead",
    title="Lookahead",
    targets=ENGINE_TARGETS,
    heads=None,
    resolve=resolve,
    measured=measured,
    build_mode="lookahead_decoding",
    triton_decoding_mode="lookahead",
    checkpoint_architecture="LlamaForCausalLM",
    drafts_tree=False,
    auto_reason="auto: no heads, Lookahead needs no extra weights",
    maintenance=1,
    prior_acceptance=1.63,
    cost_terms=("lookahead_row_s",),
    lora_refusal="Lookahead",
    served_settings=served_settings,
    served_drafting=served_drafting,
    recorded=recorded,
    recorded_keys=("lookahead",),
)
