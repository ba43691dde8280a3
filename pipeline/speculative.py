"""Resolved speculative-decoding settings and the numbers TensorRT-LLM 1.2 derives from them.

These dataclasses are what the plan carries to every later stage: the converter, the
trtllm-build argv, the engine config and the Triton parameters all read ``max_draft_len``
and friends from here, so build-time and serve-time values cannot drift apart.

Each config's ``check()`` turns a variant's spec into the config and reports, located at
spec key paths, every TensorRT-LLM 1.2 rule the combination breaks (as vLLM's
``SpeculativeConfig`` validates itself); the planner only orchestrates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from pipeline import inputs, trees
from pipeline.errors import InputError
from pipeline.files import kind_of, read_json
from pipeline.geometry import ModelGeometry
from pipeline.yaml_source import KeyPath

if TYPE_CHECKING:
    from pipeline.spec import VariantSpec

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


_Layout = TypeVar("_Layout")
_HEADS_FOLDERS = {
    "medusa": "the Medusa heads (medusa_lm_head.safetensors, or a ModelOpt checkpoint with its config.json)",
    "eagle": "the EAGLE-1 drafter (config.json and model.safetensors)",
}


def _read_heads(method: str, heads_dir: Path, read: Callable[[Path], _Layout], problems: Problems) -> _Layout | None:
    """``read(heads_dir)``, or None with the problem reported at ``heads.<method>.path`` (file:line)."""
    where = ("heads", method, "path")
    if not heads_dir.is_dir():
        problems.error(
            where,
            f"{heads_dir} is {kind_of(heads_dir)}, not a folder; heads.{method}.path must name the folder "
            f"holding {_HEADS_FOLDERS[method]}",
        )
        return None
    try:
        return read(heads_dir)
    except InputError as exc:
        problems.error(where, str(exc))
        return None


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


class Problems(Protocol):
    """Where ``check()`` reports: errors at a spec key path, notes for the plan."""

    def error(self, path: KeyPath, message: str) -> None: ...

    def note(self, message: str) -> None: ...


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
            layout = _read_heads("medusa", heads_dir, inputs.inspect_medusa, problems)
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
        layout = _read_heads("eagle", heads_dir, inputs.inspect_eagle, problems) if heads_dir.exists() else None
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
            if variant.target == "tensorrt":
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

    def triton_parameters(self) -> dict[str, str]:
        """``{"lookahead_window_size": "W", ...}``: the model-config parameters of these values."""
        return dict(zip(LOOKAHEAD_TRITON_KEYS, map(str, self)))

    @property
    def max_draft_len(self) -> int:
        return lookahead_max_draft_len(self.window, self.ngram, self.verification_set)

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
