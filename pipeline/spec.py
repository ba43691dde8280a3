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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline import gpus, presets, trees
from pipeline.embedded import EMBEDDED_MODELS
from pipeline.errors import InputError
from pipeline.yaml_source import KeyPath, Position, YamlDocument, format_key_path, load_yaml

VARIANT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
Dtype = Literal["float32", "float16", "bfloat16"]
TreeChoices = str | list[list[int]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelSpec(_Strict):
    builtin: str | None = None
    """An embedded model prepared by specdeploy itself (``smollm2-135m-instruct``)."""
    path: str | None = None
    """A Hugging Face checkpoint folder (relative paths are relative to the spec file)."""
    preset: str | None = None
    """Architecture preset used to plan when ``path`` does not exist (yet) on this host."""
    dtype: Dtype = "bfloat16"
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


class MedusaHeadsSpec(_Strict):
    path: str
    num_heads: int | None = Field(None, ge=1, le=16)
    """Expected head count; used only to plan while the weights are absent, else checked."""
    num_layers: int = Field(1, ge=1, le=8)


class EagleHeadsSpec(_Strict):
    path: str
    num_layers: int = Field(1, ge=1, le=1)
    """Drafter decoder layers; TensorRT-LLM's EAGLE-1 engine supports exactly one."""


class HeadsSpec(_Strict):
    medusa: MedusaHeadsSpec | None = None
    eagle: EagleHeadsSpec | None = None


class _TreeSettings(_Strict):
    choices: TreeChoices = "mc_sim_7b_63"
    max_draft_len: int | None = Field(None, ge=1, le=256)

    @field_validator("choices")
    @classmethod
    def _valid_tree(cls, value: TreeChoices) -> TreeChoices:
        trees.resolve_tree(value)
        return value


class MedusaSettings(_TreeSettings):
    pass


class EagleSettings(_TreeSettings):
    num_eagle_layers: int | None = Field(None, ge=1, le=16)
    max_non_leaves_per_layer: int = Field(10, ge=1)
    dynamic_tree: bool = False
    """EAGLE-2: expand by draft confidence instead of a fixed tree (reference backend/LLM API)."""
    dynamic_tree_max_top_k: int = Field(10, ge=1, le=64)


class LookaheadSettings(_Strict):
    window: int = Field(4, ge=1)
    ngram: int = Field(3, ge=1)
    verification_set: int = Field(4, ge=0)
    max_draft_len: int | None = Field(None, ge=1)
    """Optional; when given it must equal the value (W, N, G) implies."""


class SpeculativeSpec(_Strict):
    method: Literal["auto", "medusa", "eagle", "lookahead", "none"] = "auto"
    medusa: MedusaSettings = MedusaSettings()
    eagle: EagleSettings = EagleSettings()
    lookahead: LookaheadSettings = LookaheadSettings()


class CalibrationSpec(_Strict):
    data: str | None = None
    """Text or JSONL file; the shipped default set when unset."""
    size: int = Field(512, ge=1)
    max_seq_len: int = Field(512, ge=8)


class QuantizationSpec(_Strict):
    weights: Literal["none", "fp8"] = "none"
    kv_cache: Literal["auto", "fp8"] = "auto"
    quantize_heads: bool = False
    calibration: CalibrationSpec = CalibrationSpec()

    @model_validator(mode="after")
    def _kv_needs_weights(self) -> QuantizationSpec:
        if self.kv_cache == "fp8" and self.weights != "fp8":
            raise ValueError("kv_cache: fp8 needs weights: fp8 (ModelOpt calibrates both in one pass)")
        return self


class ParallelSpec(_Strict):
    tp: int = Field(1, ge=1, le=64)
    pp: int = Field(1, ge=1, le=64)


class BuildSpec(_Strict):
    max_batch_size: int = Field(16, ge=1)
    max_input_len: int = Field(1024, ge=1)
    max_seq_len: int = Field(2048, ge=2)
    max_num_tokens: int = Field(8192, ge=1)
    extra_flags: dict[str, str | int | float | bool] = {}
    """trtllm-build flags passed through (checked against the 1.2 flag table)."""


class ServingSpec(_Strict):
    model_name: str = Field("ensemble", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    decoupled: bool = True
    preprocessing_instances: int = Field(1, ge=1, le=64)
    postprocessing_instances: int = Field(1, ge=1, le=64)
    batch_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] = "guaranteed_no_evict"
    kv_cache_free_gpu_mem_fraction: float = Field(0.9, gt=0, le=1)
    enable_kv_cache_reuse: bool = False
    max_queue_delay_microseconds: int = Field(0, ge=0)
    host: str = "127.0.0.1"
    grpc_port: int = Field(8001, ge=1, le=65535)
    http_port: int = Field(8000, ge=1, le=65535)
    metrics_port: int = Field(8002, ge=1, le=65535)
    gpu_device_ids: list[int] | None = None


class GpuSpec(_Strict):
    type: str
    count: int = Field(1, ge=1, le=1024)
    gpus_per_node: int | None = Field(None, ge=1, le=64)

    @field_validator("type")
    @classmethod
    def _known(cls, value: str) -> str:
        gpus.gpu_type(value)
        return value


class VariantSpec(_Strict):
    """One fully resolved variant: the base spec with the variant's overrides applied."""

    name: str = Field(pattern=VARIANT_NAME_PATTERN)
    model: ModelSpec
    heads: HeadsSpec = HeadsSpec()
    speculative: SpeculativeSpec = SpeculativeSpec()
    quantization: QuantizationSpec = QuantizationSpec()
    parallel: ParallelSpec = ParallelSpec()
    build: BuildSpec = BuildSpec()
    serving: ServingSpec = ServingSpec()
    target: Literal["tensorrt", "reference"] = "tensorrt"
    gpu: GpuSpec | None = None

    @field_validator("name")
    @classmethod
    def _not_dots(cls, value: str) -> str:
        if set(value) <= {"."}:
            raise ValueError("a variant name cannot be made of dots")
        return value


class _TopLevel(_Strict):
    """Keys allowed at the top of a spec file (validated before merging variants)."""

    name: str = Field(pattern=VARIANT_NAME_PATTERN)
    description: str = ""
    variants: list[dict[str, Any]] | None = None


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
    else:
        raw_variants = list(enumerate(header.variants))

    variants: list[VariantSpec] = []
    indices: list[int | None] = []
    seen_names: dict[str, int | None] = {}
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
        if variant.name in seen_names:
            pos, shown = locate(document, index, ("name",))
            problems.append(f"{pos} {shown}: duplicate variant name '{variant.name}'")
            continue
        seen_names[variant.name] = index
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
            message = (f"{error['input']!r} is not allowed: use letters, digits, '_', '.', '-' "
                       "(no '/' or '..'; names become folder names)")
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
