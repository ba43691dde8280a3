"""What every method definition is made of: :class:`MethodDefinition`, the heads it may need, and
the plan-time helpers the per-method rules share.

A method is defined once, in its own module of this package (``medusa.py``, ``eagle.py``,
``lookahead.py``, ``plain.py``): its name, the targets it runs on, the heads or drafter it needs and
the reader that checks them, its plan-time rules (``resolve``), its spellings in the build and the
runtime configuration, and the figures rehearsal and the cost model start from. Every other module
asks the definition (:func:`pipeline.methods.definition`) instead of comparing method names; the
reference runtime's loop is the method's :class:`~pipeline.runtime.spec_decode.base.DecodingMethod`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.io.files import kind_of

if TYPE_CHECKING:
    from pipeline.methods.drafting import Drafting
    from pipeline.spec.document import VariantSpec
    from pipeline.spec.yaml_source import KeyPath

ENGINE_TARGETS = ("tensorrt", "reference")  # the targets that build TensorRT-LLM 1.2 engines (spec.target)
TARGETS = (*ENGINE_TARGETS, "pytorch")  # every target the project deploys to

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


class Problems(Protocol):
    """Where a method's ``resolve`` reports: errors at a spec key path, notes for the plan."""

    def error(self, path: KeyPath, message: str) -> None: ...

    def note(self, message: str) -> None: ...


# ``resolve(variant, arch, heads_dir, problems)``: the method's resolved config for this variant
# (None when a rule is broken and reported), heads read from ``heads_dir`` when the method has heads.
Resolve = Callable[["VariantSpec", ModelGeometry, "Path | None", Problems], Any]
# ``measured(build, built)``: the config of a candidate that rehearsal measured and recorded as ``build``
# (pipeline.evaluation.apply.candidate_build), made from ``built``, the config the candidates were built
# with (None when the build had none of this method); None when ``build`` cannot be made from it.
Measured = Callable[[dict[str, Any], Any], Any]
# ``served_settings(settings, pretrained, where)``: what a served Triton repository records of the method
# (pipeline.costmodel.served.describe), from the method settings its tensorrt_llm model's parameters set
# (pipeline.runtime.spec_decode.registry.MethodSettings), the engine's pretrained_config and the
# config.pbtxt (``where``, for errors); JSON-able, merged into the settings beside ``max_draft_len``.
ServedSettings = Callable[[Any, dict[str, Any], Path], dict[str, Any]]
# ``served_drafting(settings)``: what the cost model charges for a served repository of the method, from
# the settings describe recorded (``max_draft_len`` and served_settings').
ServedDrafting = Callable[[dict[str, Any]], "Drafting"]
# ``recorded(candidate)``: what a build of a measured rehearsal candidate (pipeline.evaluation.candidates.
# Candidate: its MethodSettings and per-request Lookahead setting) records of the method's own settings,
# the keys ``measured`` reads back (pipeline.evaluation.apply.candidate_build: ``tree``, ``lookahead``, ...).
Recorded = Callable[[Any], dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class HeadsNeed:
    """The extra weights a method drafts with: ``heads.<key>`` in the spec."""

    key: str  # heads.<key> in the spec, the heads folder's method
    holds: str  # what the folder holds, for errors that name it
    training_target: float  # the acceptance length train-heads aims at on the embedded model
    splits_on_hidden: bool = True  # the converter splits the heads' linears on hidden_size under tp
    trainable: bool = True  # train-heads can train them (heads.<key>.train)
    # ``warm_start_problem(folder)``: why train-heads cannot start from the heads in ``folder``
    # (``train.init: base``), None when it can; None: any folder that holds them
    warm_start_problem: Callable[[Path], str | None] | None = None


@dataclass(frozen=True, kw_only=True)
class MethodDefinition:
    """One speculative-decoding method (or plain decoding), as every layer sees it."""

    name: str  # speculative.method in a spec, the plan's and the manifest's method
    title: str  # how a person reads it ("Medusa")
    targets: tuple[str, ...]  # the spec targets that can build and serve it
    heads: HeadsNeed | None  # the heads or drafter it needs; None: no extra weights
    resolve: Resolve | None  # its plan-time rules; None: nothing to resolve (plain decoding)
    measured: Measured | None  # the config of a measured candidate; None: nothing to configure
    build_mode: str | None  # trtllm-build --speculative_decoding_mode (None: the flag is not passed)
    triton_decoding_mode: str  # the tensorrt_llm model's decoding_mode parameter
    checkpoint_architecture: str  # the TensorRT-LLM checkpoint's architecture
    drafts_tree: bool  # verifies a token tree (tree attention rows priced per node)
    auto_reason: str | None  # method: auto picks it, in the registry's order, saying this; None: never
    maintenance: int  # method: best's tie-break, least to most to maintain
    prior_acceptance: float  # acceptance length assumed before any measurement (the LoRA decision)
    cost_terms: tuple[str, ...]  # the cost model's per-method step terms a calibration fits
    lora_refusal: str | None  # why the engine flow cannot run it on a shared LoRA engine; None: it can
    llm_api_decoding_type: str | None = None  # speculative_config.decoding_type on the PyTorch backend
    served_settings: ServedSettings | None = None  # what describe records of a served repository; None: nothing
    served_drafting: ServedDrafting | None = None  # its price from those; None: the cost model cannot price it served
    recorded: Recorded | None = None  # what rehearsal records of a measured candidate; None: nothing of its own
    recorded_keys: tuple[str, ...] = ()  # the keys ``recorded`` sets (null in every other method's record)
    # tensorrt_llm parameters its config emits that only the CPU reference backend reads (the C++ backend
    # ignores keys it does not know); the package stage's check accepts them beside the C++ backend's.
    reference_parameter_keys: tuple[str, ...] = ()
    # Its engine is built with another method's mode (EAGLE-3: none, as plain decoding's), so an engine's mode
    # never names it: the server's parameters select it (its runtime's ``claims``, or its own settings,
    # MethodSettings.own; pipeline.runtime.spec_decode.factory.served_method).
    selected_by_settings: bool = False

    @property
    def speculative(self) -> bool:
        """Whether it drafts tokens at all (plain decoding does not)."""
        return self.build_mode is not None or self.llm_api_decoding_type is not None

    @property
    def engine_mode(self) -> int:
        """build_config.speculative_decoding_mode in the engine's config.json."""
        return SPECULATIVE_DECODING_MODES[self.build_mode]


def tp_problem(arch: ModelGeometry, tp: int) -> str | None:
    """None if tensor parallelism ``tp`` can split ``arch``, else why not."""
    if arch.num_heads % tp:
        return f"tp {tp} does not divide the {arch.num_heads} attention heads"
    kv = arch.num_kv_heads
    if kv % tp and not (kv < tp and tp % kv == 0):
        return f"tp {tp} does not divide the {kv} KV heads (and cannot replicate them: tp % kv_heads != 0)"
    if arch.intermediate_size % tp:
        return f"tp {tp} does not divide intermediate_size {arch.intermediate_size}"
    return None


_Layout = TypeVar("_Layout")


def read_heads(
    heads: HeadsNeed, heads_dir: Path, read: Callable[[Path], _Layout], problems: Problems
) -> _Layout | None:
    """``read(heads_dir)``, or None with the problem reported at ``heads.<key>.path`` (file:line)."""
    where = ("heads", heads.key, "path")
    if not heads_dir.is_dir():
        problems.error(
            where,
            f"{heads_dir} is {kind_of(heads_dir)}, not a folder; heads.{heads.key}.path must name the folder "
            f"holding {heads.holds}",
        )
        return None
    try:
        return read(heads_dir)
    except InputError as exc:
        problems.error(where, str(exc))
        return None
