"""The declarative spec: a base model description plus named variants that override it.

Validation happens once, here, at the edge: pydantic models are strict (unknown keys,
wrong types and out-of-range values are errors) and every error is reported as
``file:line:col key.path: message``. Later modules receive typed objects only.
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline import trees
from pipeline.errors import InputError
from pipeline.spec import gpus, presets
from pipeline.spec.builtin import EMBEDDED_MODELS
from pipeline.spec.deploy import DNS_LABEL, DNS_SUBDOMAIN, DeploySpec
from pipeline.spec.yaml_source import KeyPath, Position, YamlDocument, format_key_path, load_yaml

VARIANT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
INT32_MAX = 2**31 - 1  # TensorRT-LLM sizes are SizeType32: a larger value overflows inside the engine
MAX_VARIANTS = 256  # each variant is a set of engines; a longer list is a generated mistake
Dtype = Literal["float32", "float16", "bfloat16"]
TreeChoices = str | list[list[int]]


class _Strict(BaseModel):
    # use_attribute_docstrings: the docstring under each field is its description, in pydantic
    # and in the JSON schema (`specdeploy schema`).
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)


class ModelSpec(_Strict):
    builtin: str | None = None
    """An embedded model prepared by specdeploy itself (``smollm2-135m-instruct``)."""
    path: str | None = None
    """A Hugging Face checkpoint folder (relative paths are relative to the spec file)."""
    preset: str | None = None
    """Architecture preset used to plan when ``path`` does not exist (yet) on this host."""
    dtype: Dtype = "bfloat16"
    """Precision of the unquantized weights, activations and the KV cache (unless FP8)."""
    adapter: str | list[str] | None = None
    """PEFT LoRA folder(s) merged into the model before quantize/convert, in the order listed."""

    @property
    def adapters(self) -> tuple[str, ...]:
        return (self.adapter,) if isinstance(self.adapter, str) else tuple(self.adapter or ())

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if self.builtin and self.path:
            raise ValueError("give either 'builtin' or 'path', not both")
        if not (self.builtin or self.path or self.preset):
            raise ValueError("give 'builtin', 'path' or 'preset'")
        if self.builtin is not None and self.builtin not in BUILTIN_MODELS:
            raise ValueError(f"unknown builtin model '{self.builtin}' (known: {', '.join(BUILTIN_MODELS)})")
        if self.preset is not None:
            presets.preset(self.preset)
        if self.adapter is not None and (not self.adapters or not all(self.adapters)):
            raise ValueError("adapter: give a PEFT LoRA folder or a non-empty list of them")
        if self.adapters and not (self.builtin or self.path):
            raise ValueError("adapter needs the base model's weights: give 'builtin' or 'path'")
        return self


BUILTIN_MODELS = tuple(EMBEDDED_MODELS)


class HeadsTrainSpec(_Strict):
    """The train-heads stage: the variant's heads trained against its own (merged) target."""

    init: Literal["base", "random"] = "base"
    """base: warm-start from the heads at ``path`` (the base's heads, which a variant inherits), so a
    fine-tune's refresh only follows the drift; random: train from scratch."""
    data: str = "self-distill"
    """self-distill: the target's greedy answers to the training prompts; fixed-text: teacher-forced on the
    Python standard library's source (one forward pass per block); or a text/JSONL file of your own."""
    tokens: int = Field(200_000, ge=64, le=INT32_MAX)
    """Training tokens at most (prompt + answer tokens when self-distilling)."""
    epochs: int = Field(2, ge=1, le=100)
    """Passes over the training tokens; the epoch with the best validation score is kept."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the target's forward passes run: cpu, or cuda (one GPU; the stage cannot run without one)."""
    seed: int = Field(0, ge=0, le=INT32_MAX)
    """Seeds initialization, batching and noise: a re-run reproduces the heads."""


class _TrainedHeads(_Strict):
    @model_validator(mode="after")
    def _path_or_training(self):
        train = getattr(self, "train", None)
        if getattr(self, "path", None) is None and (train is None or train.init == "base"):
            raise ValueError(
                "give 'path' (the heads folder)"
                + (", which train.init: base starts from; or set train.init: random" if train else "")
            )
        return self


class MedusaHeadsSpec(_TrainedHeads):
    path: str | None = None
    """Medusa heads folder (FasterDecoding layout or the compact ResBlocks-only one); relative to the spec."""
    num_heads: int | None = Field(None, ge=1, le=16)
    """Expected head count; used only to plan while the weights are absent, else checked."""
    num_layers: int = Field(1, ge=1, le=8)
    """ResBlocks per Medusa head; used only to plan while the weights are absent."""
    train: HeadsTrainSpec | None = None
    """Train the heads for this variant's target (train-heads stage); the stage's output replaces ``path``."""

    @model_validator(mode="after")
    def _random_needs_count(self) -> MedusaHeadsSpec:
        if self.train is not None and self.train.init == "random" and self.num_heads is None:
            raise ValueError("train.init: random needs num_heads (how many Medusa heads to train)")
        return self


class EagleHeadsSpec(_TrainedHeads):
    path: str | None = None
    """EAGLE-1 drafter folder (config.json + weights); relative paths are relative to the spec file."""
    num_layers: int = Field(1, ge=1, le=1)
    """Drafter decoder layers; TensorRT-LLM's EAGLE-1 engine supports exactly one."""
    train: HeadsTrainSpec | None = None
    """Train the drafter for this variant's target (train-heads stage); the stage's output replaces ``path``."""


class Eagle3HeadsSpec(_TrainedHeads):
    path: str | None = None
    """EAGLE-3 drafter folder in the Hugging Face format ModelOpt, SpecForge and NVIDIA publish
    (config.json + model.safetensors); relative paths are relative to the spec file."""
    train: HeadsTrainSpec | None = None
    """Train the drafter for this variant's target with ModelOpt (train-heads stage); the stage's output
    replaces ``path``; ``init: base`` warm-starts from the drafter at ``path``."""


class HeadsSpec(_Strict):
    medusa: MedusaHeadsSpec | None = None
    """Medusa heads for the base model (method medusa, or auto without EAGLE heads)."""
    eagle: EagleHeadsSpec | None = None
    """EAGLE-1 drafter for the base model (method eagle, or auto)."""
    eagle3: Eagle3HeadsSpec | None = None
    """EAGLE-3 drafter for the base model (method eagle3, or auto on target pytorch)."""


class _TreeSettings(_Strict):
    choices: TreeChoices = "mc_sim_7b_63"
    """The draft tree: a named tree (e.g. mc_sim_7b_63, chain_3) or a list of paths of child indices."""
    max_draft_len: int | None = Field(None, ge=1, le=256)
    """Draft tokens per step the engine is built for; the number of tree nodes when unset."""

    @field_validator("choices")
    @classmethod
    def _valid_tree(cls, value: TreeChoices) -> TreeChoices:
        trees.resolve_tree(value)
        return value


class MedusaSettings(_TreeSettings):
    pass


class EagleSettings(_TreeSettings):
    num_eagle_layers: int | None = Field(None, ge=1, le=16)
    """Drafting steps (tree depth); the depth of ``choices`` when unset, 4 for dynamic trees."""
    max_non_leaves_per_layer: int = Field(10, ge=1, le=256)
    """Most nodes of one tree level that get children (TensorRT-LLM's max_non_leaves_per_layer)."""
    dynamic_tree: bool = False
    """EAGLE-2: expand by draft confidence instead of a fixed tree (reference backend/LLM API)."""
    dynamic_tree_max_top_k: int = Field(10, ge=1, le=64)
    """EAGLE-2: candidates expanded per node of a dynamic tree."""


class LookaheadSettings(_Strict):
    window: int = Field(4, ge=1, le=INT32_MAX)
    """W: the lookahead window, how many future positions the Jacobi iteration guesses per step."""
    ngram: int = Field(3, ge=1, le=INT32_MAX)
    """N: the n-gram size; each window position carries N - 1 levels of guesses."""
    verification_set: int = Field(4, ge=0, le=INT32_MAX)
    """G: the most cached n-grams verified per step."""
    max_draft_len: int | None = Field(None, ge=1, le=INT32_MAX)
    """Optional; when given it must equal the value (W, N, G) implies."""


class NGramSettings(_Strict):
    """TensorRT-LLM's NGramDecodingConfig (its defaults, but max_draft_len, which it requires)."""

    max_draft_len: int = Field(4, ge=1, le=256)
    """K: the most draft tokens a step verifies."""
    max_matching_ngram_size: int = Field(2, ge=1, le=INT32_MAX)
    """M: the longest tail of the text looked up in the pool."""
    is_keep_all: bool = True
    """Keep every match of a pattern; false: only the longest (the most recent of equal length)."""
    is_use_oldest: bool = True
    """Draft the oldest kept match; false: the newest."""
    is_public_pool: bool = True
    """One pool for every request; false: a pool per request."""


class Eagle3Settings(_Strict):
    """TensorRT-LLM's Eagle3DecodingConfig: a linear chain of drafts, or its dynamic tree."""

    max_draft_len: int = Field(3, ge=1, le=32)
    """Draft tokens per step: the drafter runs this many times, one token each (a dynamic tree's depth)."""
    use_dynamic_tree: bool = False
    """Draft a dynamic tree: per level, the top-k children of the top-k nodes by cumulative draft
    log-probability; the best ``max_total_draft_tokens`` nodes are verified."""
    dynamic_tree_max_top_k: int | None = Field(None, ge=1, le=64)
    """The dynamic tree's k (TensorRT-LLM's ``dynamic_tree_max_topK``); required with ``use_dynamic_tree``."""
    max_total_draft_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    """Tree nodes the target verifies per step: ``max_draft_len`` to k x ``max_draft_len`` (the default)."""


class SpeculativeSpec(_Strict):
    # Any name here: the methods are defined above the spec (pipeline.methods), so the planner refuses an
    # unknown one at this key, and ``specdeploy schema`` lists the known ones.
    method: str = "auto"
    """auto: EAGLE > Medusa > Lookahead by which heads exist; best: the evaluate stage's measured choice."""
    medusa: MedusaSettings = MedusaSettings()
    """Medusa tree settings (used when the method is medusa)."""
    eagle: EagleSettings = EagleSettings()
    """EAGLE tree settings (used when the method is eagle)."""
    lookahead: LookaheadSettings = LookaheadSettings()
    """Lookahead (W, N, G) settings (used when the method is lookahead)."""
    ngram: NGramSettings = NGramSettings()
    """NGram pool settings (used when the method is ngram)."""
    eagle3: Eagle3Settings = Eagle3Settings()
    """EAGLE-3 settings (used when the method is eagle3; target pytorch)."""


class CalibrationSpec(_Strict):
    data: str | None = None
    """Text or JSONL file; the shipped default set when unset."""
    size: int = Field(512, ge=1, le=INT32_MAX)
    """Calibration samples used (the first ``size`` of the file)."""
    max_seq_len: int = Field(512, ge=8, le=INT32_MAX)
    """Tokens per calibration sample; longer samples are cut."""


class QuantizationSpec(_Strict):
    weights: Literal["none", "fp8"] = "none"
    """fp8: ModelOpt FP8 post-training quantization of the base model's linear layers."""
    kv_cache: Literal["auto", "fp8"] = "auto"
    """fp8: an FP8 KV cache (needs weights: fp8); auto: the model dtype."""
    quantize_heads: bool = False
    """Quantize the speculative heads too (not supported for Medusa by TensorRT-LLM 1.2)."""
    calibration: CalibrationSpec = CalibrationSpec()
    """The calibration text for FP8."""
    offload: Literal["none", "cpu", "disk"] = "none"
    """Where the quantize stage may put weights that do not fit the GPUs: none (the plan says it does not
    fit), cpu (host RAM) or disk (read from the checkpoint files as needed); both are much slower."""

    @model_validator(mode="after")
    def _kv_needs_weights(self) -> QuantizationSpec:
        if self.kv_cache == "fp8" and self.weights != "fp8":
            raise ValueError("kv_cache: fp8 needs weights: fp8 (ModelOpt calibrates both in one pass)")
        return self


class ParallelSpec(_Strict):
    tp: int = Field(1, ge=1, le=64)
    """Tensor parallelism: ranks each layer is split over."""
    pp: int = Field(1, ge=1, le=64)
    """Pipeline parallelism: stages the layers are split into."""


class BuildSpec(_Strict):
    max_batch_size: int = Field(16, ge=1, le=INT32_MAX)
    """Most sequences the engine runs at once."""
    max_input_len: int = Field(1024, ge=1, le=INT32_MAX)
    """Longest prompt, in tokens."""
    max_seq_len: int = Field(2048, ge=2, le=INT32_MAX)
    """Longest prompt + generated tokens; the engine adds room for the draft tokens."""
    max_num_tokens: int = Field(8192, ge=1, le=INT32_MAX)
    """Most tokens in one forward pass of the whole batch (after padding removal)."""
    max_beam_width: int = Field(1, ge=1, le=1024)
    """Most beams a request may ask for (``beam_width``); > 1 only with ``speculative.method: none``
    (TensorRT-LLM's speculative decoding serves beam width 1 only)."""
    extra_flags: dict[str, str | int | float | bool] = {}
    """trtllm-build flags passed through (checked against the 1.2 flag table)."""
    workers: int | None = Field(None, ge=1, le=64)
    """Ranks trtllm-build builds at once (``--workers``), each on its own GPU; default tp x pp.
    Fewer builds the ranks in turn on fewer GPUs (a distributed build then asks for that many)."""


HTTP_DEFAULT_MAX_REQUEST_BYTES = 1 << 20  # 1 MiB: a prompt far longer than any max_input_len


class ServingSpec(_Strict):
    model_name: str = Field("ensemble", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    """Name clients send requests to (the Triton ensemble)."""
    decoupled: bool = True
    """Streaming responses (Triton decoupled mode). false: the Python ensemble and the BLS model take
    one request per Python process, one per batch slot up to 32 (the Python backend runs requests
    concurrently only in decoupled models)."""
    preprocessing_instances: int = Field(1, ge=1, le=64)
    """Tokenizer model instances."""
    postprocessing_instances: int = Field(1, ge=1, le=64)
    """Detokenizer model instances."""
    batch_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] = "guaranteed_no_evict"
    """In-flight batching policy of the tensorrtllm model."""
    kv_cache_free_gpu_mem_fraction: float = Field(0.9, gt=0, le=1)
    """Share of the GPU memory left after loading the engine that the KV cache may take."""
    enable_kv_cache_reuse: bool = False
    """Reuse the KV cache of shared prompt prefixes across requests."""
    max_queue_delay_microseconds: int = Field(0, ge=0, le=INT32_MAX)
    """How long Triton may hold a request to batch it with others."""
    ensemble: Literal["python", "triton"] = "python"
    """What serves ``model_name``: python, a Python model that runs the ensemble's three steps itself
    (the ensemble's inputs and outputs), so a client that cancels or goes away stops the generation
    within ``cancellation_check_period_ms``; triton, Triton's own ensemble scheduler as in NVIDIA's
    repository, which never passes a cancellation on to the running ``tensorrt_llm`` step
    (triton-inference-server/core#263): an abandoned stream generates to ``max_tokens``."""
    host: str = "127.0.0.1"
    """Address the server binds; 127.0.0.1 unless it must be reached from other hosts."""
    http: bool = False
    """Triton's HTTP/REST endpoint, off by default (gRPC is what specdeploy's clients use). Request
    bodies are bounded by ``http_max_request_bytes``: on GPUs with Triton's ``--http-max-input-size``;
    on the CPU reference target, whose tritonserver 2.51 has no such option and is reported to die with
    SIGSEGV on a body of ~4 MB (triton-inference-server/server#5840), by a Caddy front on ``http_port``
    that answers 413 before anything reaches Triton."""
    http_max_request_bytes: int = Field(HTTP_DEFAULT_MAX_REQUEST_BYTES, ge=1, le=INT32_MAX)
    """Largest HTTP request body accepted, in bytes (with ``http: true``); on the reference target it
    must stay below 4 MiB."""
    grpc_port: int = Field(8001, ge=1, le=65535)
    """Triton gRPC port."""
    http_port: int = Field(8000, ge=1, le=65535)
    """Triton HTTP port."""
    metrics_port: int = Field(8002, ge=1, le=65535)
    """Triton Prometheus metrics port."""
    gpu_device_ids: list[Annotated[int, Field(ge=0, le=1023)]] | None = None
    """GPUs the ranks run on, one per rank (tp*pp), each a different CUDA device ordinal; all visible
    GPUs in order when unset."""

    @field_validator("gpu_device_ids")
    @classmethod
    def _distinct_gpus(cls, value: list[int] | None) -> list[int] | None:
        repeated = sorted({i for i in value or () if (value or []).count(i) > 1})
        if repeated:
            raise ValueError(f"lists GPU {repeated[0]} more than once ({value}); each rank needs a GPU of its own")
        return value

    lora: Literal["shared", "merged", "auto"] = "auto"
    """A LoRA fine-tune (model.adapter): shared serves it as an adapter of its base's one LoRA engine
    (plain decoding: TensorRT-LLM 1.2.1 combines the LoRA plugin with no speculative mode); merged
    merges it into an engine of its own; auto lets the planner choose per fine-tune, the fleet's predicted
    speedup against every GPU's memory (docs/concepts/fleet.md)."""
    lora_client_adapters: bool = False
    """Whether clients may send adapters of their own (``lora_weights`` and ``lora_config``) to the LoRA
    engine of this variant (the group's base). Off: its models do not declare those inputs, so Triton
    refuses such a request on a GPU as on CPU, and the deployed fine-tunes' prefetched adapters are never
    evicted by what clients send; clients reach a fine-tune by its ``lora_task_id`` or its own model
    name. On: NVIDIA's documented first request, the adapter sent with its task id, works too. A shared
    fine-tune's own models never take one (docs/concepts/reference-backend.md); set on one, or on a variant
    without a LoRA group, the plan notes that it does nothing."""


class TrafficSpec(_Strict):
    """What a LoRA fine-tune serves of the fleet's traffic (read by serving.lora: auto's decision)."""

    share: float | None = Field(None, ge=0, allow_inf_nan=False)
    """Its share of the fleet's generated tokens, normalized over the fine-tunes decided together (e.g. 0.3);
    unset: what the given shares leave, split equally (all equal when none is given); 0: no traffic."""


class GpuSpec(_Strict):
    type: str
    """GPU type the engine is planned and built for (e.g. h100-sxm-80gb); sets memory and FP8 support."""
    count: int = Field(1, ge=1, le=1024)
    """GPUs available to the variant (at least tp*pp)."""
    gpus_per_node: int | None = Field(None, ge=1, le=64)
    """GPUs per machine when the variant spans several."""
    calibration: str | None = None
    """A `specdeploy calibrate` file for this GPU type (relative to the spec file): the evaluation's
    predictions, best's choice and the release gates use its profile, intervals from its residuals."""

    @field_validator("type")
    @classmethod
    def _known(cls, value: str) -> str:
        gpus.gpu_type(value)
        return value


class EvaluationSpec(_Strict):
    """The evaluate stage: every candidate method measured on these prompts by the reference runtime."""

    prompts: str | None = None
    """JSONL ("prompt": raw text, "messages": chat turns through the chat template, or "input_ids") or plain
    text, one prompt per line; default: the repository's held-out chat and code prompts."""
    count: int = Field(32, ge=1, le=10000)
    """How many prompts to decode (the first ones of the file)."""
    max_new_tokens: int = Field(64, ge=1, le=4096)
    """Tokens generated per prompt, greedily, by every candidate."""
    batch_sizes: list[int] = Field([1, 8, 32], min_length=1)
    """Concurrencies to predict GPU speedups for; the first is the expected one (method: best chooses there)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the reference runtime runs: cpu, or cuda (one GPU, for models too large for a CPU)."""
    prefer: list[Literal["none", "lookahead", "ngram", "medusa", "eagle"]] | None = None
    """method: best's tie rule, for candidates whose predicted intervals overlap: the method order to
    prefer (default none, lookahead, ngram, medusa, eagle: the least to maintain first; unlisted methods follow
    in that order)."""

    @field_validator("prefer")
    @classmethod
    def _unique(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("each method at most once")
        return value

    @field_validator("batch_sizes")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(b < 1 for b in value):
            raise ValueError("batch sizes must be >= 1")
        return value


class ReleaseSpec(_Strict):
    """Gates the evaluated choice must pass (pipeline/evaluation/choose.py)."""

    min_acceptance_length: float | None = Field(None, ge=1.0)
    """The measured mean acceptance length the chosen method must reach."""
    min_speedup: float | None = Field(None, gt=0)
    """The predicted GPU speedup it must reach at evaluation.batch_sizes[0] on gpu.type."""
    speedup_bound: Literal["low", "point"] = "low"
    """What min_speedup is checked against: low, the lower end of the prediction's interval (its method's
    held-out error); point, the point prediction."""
    max_batch_for_speculation: int | None = Field(None, ge=1)
    """Speculate only when the expected concurrency (evaluation.batch_sizes[0]) is at most this."""
    on_fail: Literal["fallback", "fail"] = "fallback"
    """fallback: the next best candidate that passes, down to plain decoding; fail: exit code 6."""


class VariantSpec(_Strict):
    """One fully resolved variant: the base spec with the variant's overrides applied."""

    name: str = Field(pattern=VARIANT_NAME_PATTERN)
    """Variant name; also its folder name under the engines and Triton repository roots."""
    model: ModelSpec
    """The base model."""
    heads: HeadsSpec = HeadsSpec()
    """Speculative-decoding heads (Medusa, EAGLE), when the method needs them."""
    speculative: SpeculativeSpec = SpeculativeSpec()
    """The speculative-decoding method and its settings."""
    quantization: QuantizationSpec = QuantizationSpec()
    """FP8 weights and KV cache."""
    parallel: ParallelSpec = ParallelSpec()
    """Tensor and pipeline parallelism."""
    build: BuildSpec = BuildSpec()
    """The trtllm-build limits."""
    serving: ServingSpec = ServingSpec()
    """The Triton model repository and server."""
    target: Literal["tensorrt", "reference", "pytorch"] = "tensorrt"
    """tensorrt: a TensorRT-LLM 1.2 engine for GPUs; reference: the CPU reference backend; pytorch:
    TensorRT-LLM's PyTorch backend (LLM API, trtllm-serve) on GPUs, no engine build."""
    traffic: TrafficSpec = TrafficSpec()
    """The variant's share of the fleet's traffic (LoRA fine-tunes with serving.lora: auto)."""
    gpu: GpuSpec | None = None
    """The GPUs planned for (memory and FP8 checks); unchecked when unset."""
    evaluation: EvaluationSpec | None = None
    """The evaluate stage: every candidate method measured before the build; unset: no evaluation."""
    release: ReleaseSpec | None = None
    """Gates the evaluated choice must pass to ship; unset: no gates."""
    deploy: DeploySpec = DeploySpec()
    """The Kubernetes manifests (namespace, volume claim, image, replicas) written beside the release."""

    @field_validator("name")
    @classmethod
    def _not_dots(cls, value: str) -> str:
        if set(value) <= {"."}:
            raise ValueError("a variant name cannot be made of dots")
        return value


class _TopLevel(_Strict):
    """Keys allowed at the top of a spec file (validated before merging variants)."""

    name: str = Field(pattern=VARIANT_NAME_PATTERN)
    """The spec's name; also the variant name when the spec has no variants."""
    description: str = ""
    """Free text."""
    variants: list[dict[str, Any]] | None = None
    """Variants, each a name plus overrides of the keys above; mappings merge, null resets a key."""


BASE_KEYS = tuple(k for k in VariantSpec.model_fields if k != "name")


@dataclass(frozen=True)
class Spec:
    file: Path
    name: str
    description: str
    variants: tuple[VariantSpec, ...]
    document: YamlDocument
    # For each variant, which key paths the variant itself set (for error locations).
    variant_indices: tuple[int | None, ...]

    @property
    def base_dir(self) -> Path:
        return self.file.parent

    def locate(self, variant: str, path: KeyPath) -> tuple[Position, str]:
        """Where a (possibly inherited) value of a variant was written, and its display path."""
        index = self.variant_indices[[v.name for v in self.variants].index(variant)]
        return locate(self.document, index, path)

    def resolve_path(self, value: str) -> Path:
        path = Path(value).expanduser()
        return path if path.is_absolute() else (self.base_dir / path)


def locate(document: YamlDocument, variant_index: int | None, path: KeyPath) -> tuple[Position, str]:
    if variant_index is not None:
        own = ("variants", variant_index) + tuple(path)
        for end in range(len(own), 2, -1):
            if own[:end] in document.positions:
                return document.positions[own[:end]], format_key_path(own)
    return document.position(tuple(path)), format_key_path(tuple(path))


def load_spec(path: Path) -> Spec:
    """Load and validate a spec; raises InputError listing every problem found."""
    document = load_yaml(path)
    data = document.data
    if not isinstance(data, dict):
        raise InputError(f"{document.file}:1:1 the spec must be a mapping of keys (name, model, variants, ...)")
    top = {k: v for k, v in data.items() if k in ("name", "description", "variants")}
    base = {k: v for k, v in data.items() if k not in top}
    problems: list[str] = []
    for key in base:
        if key not in BASE_KEYS:
            problems.append(_unknown_key(document, None, (key,), tuple(_TopLevel.model_fields) + BASE_KEYS))
    try:
        header = _TopLevel.model_validate(top)
    except ValidationError as exc:
        problems.extend(_format_errors(exc, document, None, _TopLevel))
        raise InputError("\n".join(problems)) from None
    if problems:
        raise InputError("\n".join(problems))

    raw_variants: list[tuple[int | None, dict[str, Any]]]
    if header.variants is None:
        raw_variants = [(None, {"name": header.name})]
    elif not header.variants:
        raise InputError(f"{document.position(('variants',))} variants: the list is empty; remove it or add a variant")
    elif len(header.variants) > MAX_VARIANTS:
        raise InputError(
            f"{document.position(('variants',))} variants: {len(header.variants)} variants, more "
            f"than the {MAX_VARIANTS} a spec may hold; split the spec"
        )
    else:
        raw_variants = list(enumerate(header.variants))

    variants: list[VariantSpec] = []
    indices: list[int | None] = []
    seen_names: dict[str, str] = {}  # casefolded -> as written
    for index, overrides in raw_variants:
        if not isinstance(overrides, dict):
            pos = document.position(("variants", index))
            problems.append(f"{pos} variants[{index}]: each variant must be a mapping with a 'name'")
            continue
        merged = _deep_merge(base, overrides)
        try:
            variant = VariantSpec.model_validate(merged)
        except ValidationError as exc:
            problems.extend(_format_errors(exc, document, index, VariantSpec))
            continue
        other = seen_names.get(variant.name.casefold())
        if other is not None:
            pos, shown = locate(document, index, ("name",))
            problems.append(
                f"{pos} {shown}: duplicate variant name '{variant.name}'"
                if other == variant.name
                else f"{pos} {shown}: variant name '{variant.name}' differs from '{other}' only by case; their "
                "folders (engines/<variant>, triton_repo/<variant>) would be one on a case-insensitive "
                "filesystem (macOS, Windows shares, some object stores); rename one"
            )
            continue
        seen_names[variant.name.casefold()] = variant.name
        variants.append(variant)
        indices.append(index)
    if problems:
        raise InputError("\n".join(dict.fromkeys(problems)))
    return Spec(path, header.name, header.description, tuple(variants), document, tuple(indices))


def _deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Variant values win; mappings merge key by key; ``null`` resets a field to its default."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


_MESSAGES = {
    "missing": "required key is missing",
    "bool_type": "must be true or false",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
}


_FOLDER_NAME_RULE = "use letters, digits, '_', '.', '-' (no '/' or '..'; names become folder names)"
# What a pattern allows, in words, where it is not a folder name's (the deploy: section's Kubernetes names).
_PATTERN_RULES = {
    DNS_LABEL: "a Kubernetes name (RFC 1123 label): lowercase letters, digits and '-', starting and ending "
    "with a letter or digit, at most 63 characters",
    DNS_SUBDOMAIN: "a Kubernetes name (RFC 1123 subdomain): lowercase letters, digits, '-' and '.', starting "
    "and ending with a letter or digit, at most 253 characters",
}


def _format_errors(exc: ValidationError, document: YamlDocument, index: int | None, root: type[BaseModel]) -> list[str]:
    lines = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        # Union members add their type name to the location; drop those parts.
        loc = tuple(part for part in loc if not (isinstance(part, str) and ("[" in part or part in ("str", "list"))))
        kind = error["type"]
        if kind == "extra_forbidden":
            lines.append(_unknown_key(document, index, loc, _allowed_keys(root, loc[:-1])))
            continue
        pos, shown = locate(document, index, loc)
        ctx = error.get("ctx", {})
        if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
            op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
            bound = next(iter(ctx.values()))
            message = f"must be {op} {bound} (got {error['input']!r})"
        elif kind == "literal_error":
            message = f"must be one of {ctx.get('expected')} (got {error['input']!r})"
        elif kind == "string_pattern_mismatch":
            rule = _PATTERN_RULES.get(ctx.get("pattern", ""), _FOLDER_NAME_RULE)
            message = f"{error['input']!r} is not allowed: {rule}"
        elif kind == "value_error":
            message = str(ctx.get("error", error["msg"]))
        elif kind in _MESSAGES:
            got = "" if kind == "missing" else f" (got {type(error['input']).__name__} {error['input']!r})"
            message = _MESSAGES[kind] + got
        else:
            message = error["msg"]
        lines.append(f"{pos} {shown}: {message}")
    return lines


def _allowed_keys(root: type[BaseModel], loc: KeyPath) -> tuple[str, ...]:
    model: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return ()
        model = field.annotation
        for candidate in getattr(model, "__args__", ()):  # Optional[Model]
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                model = candidate
    if isinstance(model, type) and issubclass(model, BaseModel):
        return tuple(model.model_fields)
    return ()


def _unknown_key(document: YamlDocument, index: int | None, loc: KeyPath, allowed: tuple[str, ...]) -> str:
    pos, shown = locate(document, index, loc)
    key = str(loc[-1])
    hint = difflib.get_close_matches(key, allowed, n=1)
    suggestion = f"; did you mean '{hint[0]}'?" if hint else (f" (allowed: {', '.join(allowed)})" if allowed else "")
    return f"{pos} {shown}: unknown key '{key}'{suggestion}"
