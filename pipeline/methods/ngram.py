"""NGram (prompt lookup; Saxena, "Prompt Lookup Decoding", 2023): drafts are the tokens that followed
an earlier occurrence of the text's last few tokens, in the prompt or the output so far; one target
pass verifies the chain.

No extra weights. TensorRT-LLM's PyTorch backend runs it as ``NGramDecodingConfig`` (decoding_type
``NGram``: ``max_draft_len``, ``max_matching_ngram_size``, ``is_keep_all``, ``is_use_oldest``,
``is_public_pool``; tensorrt_llm/llmapi/llm_args.py and the pool in
tensorrt_llm/_torch/speculative/ngram.py), and its engine flow as external draft tokens
(``--speculative_decoding_mode draft_tokens_external``, examples/prompt_lookup), which the Triton C++
backend cannot draft for itself: so it runs on the reference target and the PyTorch-backend target
(``pytorch``), where ``method: auto`` chooses it. The reference runtime's loop is
:class:`pipeline.runtime.spec_decode.ngram.NGramDecoding`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from pipeline.geometry import ModelGeometry
from pipeline.methods.base import MethodDefinition, Problems
from pipeline.methods.drafting import Drafting

if TYPE_CHECKING:
    from pipeline.spec.document import VariantSpec

# The reference backend's Triton parameters for the pool's settings (the C++ backend ignores them).
NGRAM_TRITON_KEYS = (
    "reference_ngram_max_matching_ngram_size",
    "reference_ngram_is_keep_all",
    "reference_ngram_is_use_oldest",
    "reference_ngram_is_public_pool",
)


@dataclass(frozen=True)
class NGramConfig:
    """TensorRT-LLM's NGramDecodingConfig, one type from the spec to the runtime."""

    max_draft_len: int  # K: the most draft tokens a step verifies
    max_matching_ngram_size: int = 2  # M: the longest tail of the text looked up (TensorRT-LLM's default)
    keep_all: bool = True  # keep every match of a pattern (else only the longest, the most recent)
    use_oldest: bool = True  # draft the oldest kept match (else the newest)
    public_pool: bool = True  # one pool for every request (else one per request)

    def describe(self) -> str:
        """One line for the plan: ``ngram: K=4 M=2``."""
        return f"ngram: K={self.max_draft_len} M={self.max_matching_ngram_size}"

    def llm_api_config(self, drafter: PurePosixPath | None = None) -> dict[str, object]:
        """The LLM API's ``speculative_config`` (``decoding_type: NGram`` selects NGramDecodingConfig);
        ``drafter`` is unused (NGram drafts from the text)."""
        return {
            "decoding_type": "NGram",
            "max_draft_len": self.max_draft_len,
            "max_matching_ngram_size": self.max_matching_ngram_size,
            "is_keep_all": self.keep_all,
            "is_use_oldest": self.use_oldest,
            "is_public_pool": self.public_pool,
        }

    def triton_parameters(self) -> dict[str, str]:
        """The pool's settings as the reference backend's ``reference_ngram_*`` parameters (K is the engine's)."""
        values = (self.max_matching_ngram_size, self.keep_all, self.use_oldest, self.public_pool)
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in zip(NGRAM_TRITON_KEYS, values)}

    def drafting(self) -> Drafting:
        """What a step costs beyond the verification pass: a chain of K rows, no weights."""
        return Drafting.ngram(self.max_draft_len)

    @classmethod
    def check(cls, variant: VariantSpec, problems: Problems) -> NGramConfig | None:
        settings = variant.speculative.ngram
        if settings.max_matching_ngram_size > settings.max_draft_len + 64:
            problems.error(
                ("speculative", "ngram", "max_matching_ngram_size"),
                f"{settings.max_matching_ngram_size} is far beyond max_draft_len {settings.max_draft_len}: "
                "a pattern that long almost never recurs; TensorRT-LLM's default is 2",
            )
            return None
        return cls(
            settings.max_draft_len,
            settings.max_matching_ngram_size,
            settings.is_keep_all,
            settings.is_use_oldest,
            settings.is_public_pool,
        )


def resolve(
    variant: VariantSpec, arch: ModelGeometry, heads_dir: Path | None, problems: Problems
) -> NGramConfig | None:
    return NGramConfig.check(variant, problems)


def measured(build: dict[str, Any], built: NGramConfig | None) -> NGramConfig | None:
    """A measured pool setting needs no extra weights: any recorded one can be built."""
    return NGramConfig(*build["ngram"]) if build.get("ngram") else None


def served_settings(settings: Any, pretrained: dict[str, Any], where: Path) -> dict[str, Any]:
    """The pool's longest looked-up tail, when the reference backend's ``reference_ngram_*`` set it."""
    if settings.ngram is None:
        return {}
    return {"ngram_max_matching_ngram_size": settings.ngram.max_matching_ngram_size}


def served_drafting(settings: dict[str, Any]) -> Drafting:
    return Drafting.ngram(settings["max_draft_len"])


def recorded(candidate: Any) -> dict[str, Any]:
    """The measured pool's settings (read back by :func:`measured` as NGramConfig's fields)."""
    pool = candidate.settings.ngram
    return {"ngram": dataclasses.astuple(pool) if pool else None}


DEFINITION = MethodDefinition(
    name="ngram",
    title="NGram",
    targets=("reference", "pytorch"),
    heads=None,
    resolve=resolve,
    measured=measured,
    build_mode="draft_tokens_external",
    triton_decoding_mode="top_k_top_p",  # none of its own (the C++ backend has no NGram mode): the plain one
    checkpoint_architecture="LlamaForCausalLM",
    drafts_tree=False,
    # auto picks it where nothing before it runs (the PyTorch backend); on the engine targets Lookahead comes first
    auto_reason="auto: NGram (no extra weights; drafts from the text so far)",
    maintenance=1,
    # NVIDIA's NGram blog (TensorRT-LLM docs/source/blogs/tech_blog/blog7_NGram_performance_Analysis_And_
    # Auto_Enablement.md): acceptance length 1.66 on second turns of 3000 conversations.
    prior_acceptance=1.66,
    cost_terms=(),
    lora_refusal="NGram",
    served_settings=served_settings,
    served_drafting=served_drafting,
    recorded=recorded,
    recorded_keys=("ngram",),
    reference_parameter_keys=NGRAM_TRITON_KEYS,
)
