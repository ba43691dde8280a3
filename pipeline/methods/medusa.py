"""Medusa (Cai et al., arXiv 2401.10774): extra decoding heads on the target's last hidden state
draft a token tree, verified in one target pass.

Runs on the engine target and the reference backend; the heads are ``heads.medusa`` (ModelOpt's
or the original repository's layout); the reference runtime's loop is
:class:`pipeline.runtime.spec_decode.medusa.MedusaDecoding`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import trees
from pipeline.geometry import ModelGeometry
from pipeline.methods import heads_reader
from pipeline.methods.base import ENGINE_TARGETS, HeadsNeed, MethodDefinition, Problems, read_heads
from pipeline.methods.drafting import Drafting

if TYPE_CHECKING:
    from pipeline.spec.document import VariantSpec


def _warm_start_problem(heads_dir: Path) -> str | None:
    """train-heads warm-starts from specdeploy's compact heads only (pipeline/heads/export.py writes them)."""
    if heads_reader.is_compact_medusa(heads_dir):
        return None
    return (
        "init: base needs specdeploy's compact Medusa heads (medusa_resblocks.safetensors); "
        "use init: random for FasterDecoding folders"
    )


HEADS = HeadsNeed(
    key="medusa",
    holds="the Medusa heads (medusa_lm_head.safetensors, or a ModelOpt checkpoint with its config.json)",
    training_target=2.3,
    warm_start_problem=_warm_start_problem,
)


@dataclass(frozen=True)
class MedusaConfig:
    num_heads: int
    num_layers: int
    tree: trees.Tree
    max_draft_len: int

    @classmethod
    def check(
        cls, variant: VariantSpec, arch: ModelGeometry, heads_dir: Path, problems: Problems
    ) -> MedusaConfig | None:
        """The Medusa config of ``variant`` (heads read from ``heads_dir`` when present)."""
        head_spec, settings = variant.heads.medusa, variant.speculative.medusa
        assert head_spec is not None
        if heads_dir.exists():
            layout = read_heads(HEADS, heads_dir, heads_reader.inspect_medusa, problems)
            if layout is None:
                return None
            num_heads, num_layers = layout.num_heads, layout.num_layers
            if layout.config_num_heads not in (None, num_heads):
                problems.note(
                    f"{heads_dir}/config.json says {layout.config_num_heads} Medusa heads but the "
                    f"weights hold {num_heads}; using {num_heads} (TensorRT-LLM's default of 4 would be "
                    "wrong too)"
                )
            if head_spec.num_heads not in (None, num_heads):
                problems.error(
                    ("heads", "medusa", "num_heads"),
                    f"the weights in {heads_dir} hold {num_heads} "
                    f"heads, not {head_spec.num_heads}; fix or remove "
                    "num_heads",
                )
        elif head_spec.num_heads is not None:
            num_heads, num_layers = head_spec.num_heads, head_spec.num_layers
            problems.note(f"Medusa heads not found at {heads_dir}: planned with num_heads {num_heads} from the spec")
        else:
            problems.error(
                ("heads", "medusa", "path"),
                f"{heads_dir}: not found; add heads.medusa.num_heads to plan without the weights",
            )
            return None
        tree = trees.resolve_tree(settings.choices)
        max_draft_len = settings.max_draft_len or len(tree)
        if trees.tree_depth(tree) > num_heads:
            problems.error(
                ("speculative", "medusa", "choices"),
                f"tree depth {trees.tree_depth(tree)} exceeds the {num_heads} Medusa heads; "
                "use a shallower tree (e.g. chain_3) or more heads",
            )
        if len(tree) > max_draft_len:
            problems.error(
                ("speculative", "medusa", "max_draft_len"),
                f"{len(tree)} tree nodes exceed max_draft_len {max_draft_len}",
            )
        if arch.vocab_size % variant.parallel.tp:
            problems.error(
                ("parallel", "tp"),
                f"Medusa needs vocab_size {arch.vocab_size} divisible by tp "
                f"{variant.parallel.tp} (TensorRT-LLM does not pad Medusa lm_heads)",
            )
        if variant.quantization.quantize_heads:
            problems.error(
                ("quantization", "quantize_heads"),
                "FP8 Medusa heads fail to build in TensorRT-LLM 1.2 (NVIDIA/TensorRT-LLM#2115); "
                "keep quantize_heads: false (FP8 base, 16-bit heads)",
            )
        return cls(num_heads, num_layers, tree, max_draft_len)

    def describe(self) -> str:
        """One line for the plan: ``medusa: 4 heads, 63-node tree``."""
        return f"medusa: {self.num_heads} heads, {len(self.tree or ())}-node tree"

    def triton_parameters(self) -> dict[str, str]:
        """The tensorrt_llm model's ``medusa_choices`` (the compact form Triton takes)."""
        return {"medusa_choices": trees.to_triton_choices(self.tree)}

    def checkpoint_fields(self) -> dict[str, int]:
        """What the TensorRT-LLM checkpoint's config.json carries of the heads (the C++ runtime refuses a
        Medusa engine without both)."""
        return {"num_medusa_heads": self.num_heads, "max_draft_len": self.max_draft_len}

    def engine_heads_params(self, arch: ModelGeometry, tp: int) -> int:
        """The heads' parameters the engine holds, all ranks together: each head's ResBlocks and its
        lm_head over the vocabulary padded to a multiple of ``tp``."""
        h, padded_vocab = arch.hidden_size, math.ceil(arch.vocab_size / tp) * tp
        return self.num_heads * (self.num_layers * (h * h + h) + padded_vocab * h)

    def stored_heads_params(self, arch: ModelGeometry) -> int:
        """The heads' parameters as stored (the vocabulary unpadded)."""
        h = arch.hidden_size
        return self.num_heads * (self.num_layers * (h * h + h) + arch.vocab_size * h)

    def drafting(self) -> Drafting:
        """What a step of these heads costs beyond the verification pass."""
        return Drafting.medusa(self.tree, self.num_heads)


def resolve(
    variant: VariantSpec, arch: ModelGeometry, heads_dir: Path | None, problems: Problems
) -> MedusaConfig | None:
    assert heads_dir is not None
    return MedusaConfig.check(variant, arch, heads_dir, problems)


def measured(build: dict[str, Any], built: MedusaConfig | None) -> MedusaConfig | None:
    """The built heads with the measured tree, if it fits the engine's max_draft_len."""
    tree = trees.tree_or_empty(build.get("tree") or [])
    if built is None or not tree or len(tree) > built.max_draft_len:
        return None
    return dataclasses.replace(built, tree=tree)


def served_settings(settings: Any, pretrained: dict[str, Any], where: Path) -> dict[str, Any]:
    """The served tree (TensorRT-LLM's default when medusa_choices is unset) and the engine's heads."""
    return {
        "medusa_choices": [list(n) for n in (settings.medusa_choices or trees.MC_SIM_7B_63)],
        "medusa_heads": int(pretrained.get("num_medusa_heads") or 0),
    }


def served_drafting(settings: dict[str, Any]) -> Drafting:
    tree = tuple(tuple(n) for n in settings["medusa_choices"])
    return Drafting.medusa(tree, settings.get("medusa_heads") or None)


def recorded(candidate: Any) -> dict[str, Any]:
    """The measured candidate's tree (rehearsal's record, read back by :func:`measured`)."""
    tree = candidate.settings.medusa_choices
    return {"tree": [list(node) for node in tree] if tree is not None else None}


DEFINITION = MethodDefinition(
    name="medusa",
    title="Medusa",
    targets=ENGINE_TARGETS,
    heads=HEADS,
    resolve=resolve,
    measured=measured,
    build_mode="medusa",
    triton_decoding_mode="medusa",
    checkpoint_architecture="MedusaForCausalLM",
    drafts_tree=True,
    auto_reason="auto: Medusa heads present",
    maintenance=2,
    prior_acceptance=2.33,
    cost_terms=("tree_row_s",),
    lora_refusal="Medusa: the heads are one set for every adapter (lora_params reach the base model only, "
    "tensorrt_llm/models/medusa/model.py)",
    served_settings=served_settings,
    served_drafting=served_drafting,
    recorded=recorded,
    recorded_keys=("tree",),
)
