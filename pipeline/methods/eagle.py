"""EAGLE-1/2 (Li et al., arXiv 2401.15077 and 2406.16858): a one-layer drafter over the target's
hidden states drafts a token tree (fixed, or EAGLE-2's dynamic tree), verified in one target pass.

Runs on the engine target and the reference backend; the drafter is ``heads.eagle`` (config.json
and model.safetensors); the reference runtime's loop is
:class:`pipeline.runtime.spec_decode.eagle.decoding.EagleDecoding`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import targets, trees
from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.io.files import read_json
from pipeline.methods import heads_reader
from pipeline.methods.base import ENGINE_TARGETS, HeadsNeed, MethodDefinition, Problems, read_heads, tp_problem
from pipeline.methods.drafting import Drafting

if TYPE_CHECKING:
    from pipeline.spec.document import VariantSpec

HEADS = HeadsNeed(
    key="eagle",
    holds="the EAGLE-1 drafter (config.json and model.safetensors)",
    training_target=3.0,
)
EAGLE_MAX_DRAFT_LEN = 256  # builder.py asserts max_draft_len <= 256 for EAGLE
EAGLE_MAX_BATCH_SIZE = 512  # builder.py asserts max_batch_size <= 512 for EAGLE
# EAGLE-2's dynamic tree, which the C++ backend does not expose: the reference backend's own parameters.
DYNAMIC_TREE_KEY = "reference_eagle_use_dynamic_tree"
DYNAMIC_TREE_TOP_K_KEY = "reference_eagle_dynamic_tree_max_top_k"


def eagle_dynamic_tree_size(top_k: int, num_eagle_layers: int) -> int:
    """Nodes an EAGLE-2 dynamic tree can produce before the max_draft_len cap:
    top_k at the first layer, then top_k expansions of top_k kept nodes per further layer."""
    return top_k + top_k * top_k * (num_eagle_layers - 1)


def _drafter_geometry(heads_dir: Path) -> ModelGeometry | None:
    """The EAGLE drafter's LlamaConfig as the converter reads it; None when it is incomplete (the
    convert stage's own header checks, run by ``validate`` with the weights, report that)."""
    try:
        config = read_json(heads_dir / "config.json", "EAGLE drafter LlamaConfig")
        if not isinstance(config, dict):
            return None
        where = str(heads_dir / "config.json")
        return ModelGeometry.from_hf(config, where, name=heads_dir.name, require_architecture=False)
    except InputError:
        return None


@dataclass(frozen=True)
class EagleConfig:
    tree: trees.Tree | None  # None with a dynamic tree
    num_eagle_layers: int
    max_non_leaves_per_layer: int
    max_draft_len: int
    dynamic_tree: bool
    dynamic_tree_max_top_k: int

    @classmethod
    def check(cls, variant: VariantSpec, arch: ModelGeometry, heads_dir: Path, problems: Problems) -> EagleConfig:
        """The EAGLE config of ``variant`` (drafter read from ``heads_dir`` when present)."""
        settings = variant.speculative.eagle
        layout = read_heads(HEADS, heads_dir, heads_reader.inspect_eagle, problems) if heads_dir.exists() else None
        if layout is not None:
            if not layout.has_fc_bias:
                problems.note(f"{heads_dir}: no fc.bias (NVIDIA/TensorRT-LLM#2588); the converter writes zeros")
            if layout.hidden_size not in (None, arch.hidden_size):
                problems.error(
                    ("heads", "eagle", "path"),
                    f"EAGLE hidden size {layout.hidden_size} does not match the base model's {arch.hidden_size}",
                )
            drafter = _drafter_geometry(heads_dir)
            if drafter is not None:  # the convert stage's refusals (pipeline/checkpoint/heads.py, layout.py)
                if drafter.vocab_size != arch.vocab_size:
                    problems.error(
                        ("heads", "eagle", "path"),
                        f"EAGLE drafter vocab_size {drafter.vocab_size} does not match the base model's "
                        f"{arch.vocab_size}; the drafter was trained for another base model",
                    )
                drafter_tp = tp_problem(drafter, variant.parallel.tp)
                if drafter_tp:
                    problems.error(("parallel", "tp"), f"{drafter_tp} of the EAGLE drafter ({heads_dir}/config.json)")
            if layout.num_layers != 1:
                problems.error(
                    ("heads", "eagle", "path"),
                    f"{heads_dir} has {layout.num_layers} drafter layers; "
                    "the TensorRT-LLM EAGLE-1 engine supports exactly one",
                )
        elif not heads_dir.exists():
            problems.note(f"EAGLE heads not found at {heads_dir}: planned without reading them")
        if arch.architecture != "LlamaForCausalLM":
            problems.error(
                ("model",),
                f"EAGLE in the TensorRT engine flow supports LLaMA bases only, "
                f"not {arch.architecture} (NVIDIA/TensorRT-LLM#10396)",
            )
        if variant.parallel.pp != 1:
            problems.error(
                ("parallel", "pp"),
                "EAGLE does not support pipeline parallelism in TensorRT-LLM 1.2; use pp: 1 (raise tp instead)",
            )
        if variant.build.max_batch_size > EAGLE_MAX_BATCH_SIZE:
            problems.error(("build", "max_batch_size"), f"EAGLE engines allow max_batch_size <= {EAGLE_MAX_BATCH_SIZE}")
        if variant.quantization.kv_cache == "fp8":
            # The convert stage's refusal (pipeline/checkpoint/layout.py), made before any weight is read.
            problems.error(
                ("quantization", "kv_cache"),
                "an FP8 KV cache with EAGLE is not supported: the drafter's layers share the KV cache and "
                "have no calibrated KV scales; use kv_cache: auto (FP8 weights stay)",
            )
        if variant.quantization.weights == "fp8":
            problems.note(
                "FP8 with EAGLE is experimental in TensorRT-LLM 1.2 (not in its support matrix); "
                "check acceptance on the reference backend and on a GPU before release"
            )
        if settings.dynamic_tree:
            layers = settings.num_eagle_layers or 4
            size = eagle_dynamic_tree_size(settings.dynamic_tree_max_top_k, layers)
            max_draft_len = settings.max_draft_len or min(size, EAGLE_MAX_DRAFT_LEN)
            if not targets.definition(variant.target).dynamic_eagle_trees:
                problems.note(
                    "EAGLE-2 dynamic trees are not exposed by the Triton TensorRT-LLM backend (only "
                    "eagle_choices); Triton will serve the static default tree"
                )
            config = cls(
                None, layers, settings.max_non_leaves_per_layer, max_draft_len, True, settings.dynamic_tree_max_top_k
            )
        else:
            tree = trees.resolve_tree(settings.choices)
            depth = trees.tree_depth(tree)
            layers = settings.num_eagle_layers or depth
            if depth != layers:
                problems.error(
                    ("speculative", "eagle", "num_eagle_layers"),
                    f"must equal the eagle_choices tree depth {depth} (got {layers})",
                )
            widest = max(trees.non_leaves_per_level(tree))
            if widest > settings.max_non_leaves_per_layer:
                problems.error(
                    ("speculative", "eagle", "choices"),
                    f"a tree level has {widest} non-leaf nodes, more than max_non_leaves_per_layer "
                    f"{settings.max_non_leaves_per_layer}",
                )
            max_draft_len = settings.max_draft_len or len(tree)
            if len(tree) > max_draft_len:
                problems.error(
                    ("speculative", "eagle", "max_draft_len"),
                    f"{len(tree)} tree nodes exceed max_draft_len {max_draft_len}",
                )
            config = cls(
                tree, layers, settings.max_non_leaves_per_layer, max_draft_len, False, settings.dynamic_tree_max_top_k
            )
        if config.max_draft_len > EAGLE_MAX_DRAFT_LEN:
            problems.error(("speculative", "eagle", "max_draft_len"), f"EAGLE allows at most {EAGLE_MAX_DRAFT_LEN}")
        return config

    def describe(self) -> str:
        """One line for the plan: ``eagle: 1 layers, dynamic (EAGLE-2)``."""
        tree = "dynamic (EAGLE-2)" if self.dynamic_tree else f"{len(self.tree or ())}-node tree"
        return f"eagle: {self.num_eagle_layers} layers, {tree}"

    def triton_parameters(self) -> dict[str, str]:
        """``eagle_choices`` for a static tree; EAGLE-2 is not exposed by the C++ backend (it ignores
        unknown keys), so a dynamic tree is the reference backend's ``reference_eagle_*`` parameters."""
        if not self.dynamic_tree and self.tree is not None:
            return {"eagle_choices": trees.to_triton_choices(self.tree)}
        return {
            DYNAMIC_TREE_KEY: "true",
            DYNAMIC_TREE_TOP_K_KEY: str(self.dynamic_tree_max_top_k),
        }

    def checkpoint_fields(self) -> dict[str, int]:
        """What the TensorRT-LLM checkpoint's config.json carries of the drafter."""
        return {
            "num_eagle_layers": self.num_eagle_layers,
            "max_draft_len": self.max_draft_len,
            "max_non_leaves_per_layer": self.max_non_leaves_per_layer,
        }

    def engine_heads_params(self, arch: ModelGeometry, tp: int) -> int:
        """The drafter's parameters the engine holds, all ranks together: TensorRT-LLM instantiates it
        once per draft layer (fc 2H x H with its bias, one decoder layer, an lm_head over the vocabulary
        padded to a multiple of ``tp``)."""
        h, padded_vocab = arch.hidden_size, math.ceil(arch.vocab_size / tp) * tp
        return self.num_eagle_layers * (2 * h * h + h + arch.decoder_layer_params() + padded_vocab * h)

    def stored_heads_params(self, arch: ModelGeometry) -> int:
        """The drafter's parameters as stored: once, fc and its decoder layer (the base's lm_head is used)."""
        h = arch.hidden_size
        return 2 * h * h + h + arch.decoder_layer_params()

    def drafting(self) -> Drafting:
        """What a step of this drafter costs beyond the verification pass (EAGLE-2: its dynamic tree)."""
        if self.dynamic_tree or self.tree is None:
            return Drafting.eagle_dynamic(self.dynamic_tree_max_top_k, self.num_eagle_layers, self.max_draft_len)
        return Drafting.eagle(self.tree)


def resolve(variant: VariantSpec, arch: ModelGeometry, heads_dir: Path | None, problems: Problems) -> EagleConfig:
    assert heads_dir is not None
    return EagleConfig.check(variant, arch, heads_dir, problems)


def measured(build: dict[str, Any], built: EagleConfig | None) -> EagleConfig | None:
    """The built drafter with the measured tree (EAGLE-2: the dynamic tree and its top_k), if the tree
    has the drafter's depth and fits the engine's max_draft_len."""
    if built is None:
        return None
    if build.get("dynamic_tree"):
        top_k = int(build["dynamic_tree_max_top_k"])
        return dataclasses.replace(built, tree=None, dynamic_tree=True, dynamic_tree_max_top_k=top_k)
    tree = trees.tree_or_empty(build.get("tree") or [])
    if not tree or trees.tree_depth(tree) != built.num_eagle_layers or len(tree) > built.max_draft_len:
        return None
    return dataclasses.replace(built, tree=tree, dynamic_tree=False)


def served_settings(settings: Any, pretrained: dict[str, Any], where: Path) -> dict[str, Any]:
    """The served static tree (TensorRT-LLM's default when eagle_choices is unset), the reference backend's
    EAGLE-2 keys and the engine's drafter depth."""
    return {
        "eagle_choices": [list(n) for n in (settings.eagle_choices or trees.MC_SIM_7B_63)],
        "eagle_dynamic_tree": settings.eagle_dynamic_tree,
        "eagle_dynamic_tree_max_top_k": settings.eagle_dynamic_tree_max_top_k,
        "num_eagle_layers": int(pretrained.get("num_eagle_layers") or 0),
    }


def served_drafting(settings: dict[str, Any]) -> Drafting:
    """EAGLE-2's dynamic tree when the reference backend served one, else EAGLE-1's static tree."""
    if settings.get("eagle_dynamic_tree"):
        top_k = settings.get("eagle_dynamic_tree_max_top_k") or 10
        layers = settings.get("num_eagle_layers") or 1
        return Drafting.eagle_dynamic(top_k, layers, settings.get("max_draft_len") or top_k * layers)
    return Drafting.eagle(tuple(tuple(n) for n in settings["eagle_choices"]))


def recorded(candidate: Any) -> dict[str, Any]:
    """The measured candidate's static tree (EAGLE-2's dynamic one is recorded beside, as every candidate's
    dynamic_tree keys; read back by :func:`measured`)."""
    settings = candidate.settings
    tree = settings.eagle_choices
    return {"tree": [list(node) for node in tree] if tree is not None and not settings.eagle_dynamic_tree else None}


DEFINITION = MethodDefinition(
    name="eagle",
    title="Eagle",
    targets=ENGINE_TARGETS,
    heads=HEADS,
    resolve=resolve,
    measured=measured,
    build_mode="eagle",
    triton_decoding_mode="eagle",
    checkpoint_architecture="EagleForCausalLM",
    drafts_tree=True,
    auto_reason="auto: EAGLE heads present",
    maintenance=3,
    prior_acceptance=4.05,
    cost_terms=("level_s", "tree_row_s"),
    lora_refusal="EAGLE: the engine's EagleNets run without lora_params (tensorrt_llm/models/eagle/model.py), "
    "so every fine-tune would draft with the base drafter",
    served_settings=served_settings,
    served_drafting=served_drafting,
    recorded=recorded,
    recorded_keys=("tree",),
    reference_parameter_keys=(DYNAMIC_TREE_KEY, DYNAMIC_TREE_TOP_K_KEY),
)
