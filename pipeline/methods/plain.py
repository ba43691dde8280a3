"""Plain decoding: one token per target pass, the baseline every method is measured against.

The reference runtime's loop is :class:`pipeline.runtime.spec_decode.base.PlainDecoding`.
"""

from __future__ import annotations

from pipeline.methods.base import TARGETS, MethodDefinition
from pipeline.methods.drafting import Drafting

DEFINITION = MethodDefinition(
    name="none",
    title="plain",
    targets=TARGETS,
    heads=None,
    resolve=None,
    measured=None,
    build_mode=None,
    triton_decoding_mode="top_k_top_p",
    checkpoint_architecture="LlamaForCausalLM",
    drafts_tree=False,
    auto_reason=None,
    maintenance=0,
    prior_acceptance=1.0,
    cost_terms=(),
    lora_refusal=None,
    served_drafting=lambda settings: Drafting.plain(),
)
