"""What trtllm-build 1.2 requires of a TensorRT-LLM checkpoint ``config.json``, and the check of one.

``trtllm-build`` (``tensorrt_llm/commands/build.py``) reads ``<checkpoint>/config.json`` with
``PretrainedConfig.from_json_file``: ``MODEL_MAP[config['architecture']].config_class(**config)``.
Every keyword-only ``__init__`` parameter without a default, every ``config['key']`` /
``kwargs['key']``, is a key the checkpoint must carry; ``mapping`` and ``quantization`` are passed
as ``Mapping(**mapping)`` / ``QuantConfig(**quantization)``, so an undeclared key there raises.
``checkpoint_fields.json`` holds these rules as data, one entry per config class with the file and
commit it was read from (NVIDIA/TensorRT-LLM; the v1.2.1 tag's own commit could not be resolved
here, these are the 1.2-era versions of the files in the public index):

* ``PretrainedConfig``, ``QuantConfig``: ``tensorrt_llm/models/modeling_utils.py`` @ 0c8de69a1ca6
  (``tensorrt_llm/version.py`` at that commit: 1.2.0rc8). Required: architecture, dtype,
  hidden_size, num_hidden_layers, num_attention_heads.
* ``Mapping``: ``tensorrt_llm/mapping.py`` @ b35ac1b64368 (1.2.0rc2): nothing required, but
  ``world_size`` must equal ``tp_size * pp_size * cp_size`` (ValueError otherwise).
* ``LLaMAConfig``: ``tensorrt_llm/models/llama/config.py`` @ 89fd9b74ab7a: everything defaulted.
* ``MedusaConfig``: ``tensorrt_llm/models/medusa/config.py`` @ a4817fb9f480: everything defaulted
  (``num_medusa_heads`` silently defaults to 4).
* ``EagleConfig``: ``tensorrt_llm/models/eagle/config.py`` @ 2a9abd9536aa: ``kwargs['eagle_net_config']``,
  itself read by ``PretrainedConfig.from_dict`` (so checked as a config of its own architecture).
* FP8: ``QuantMode.from_quant_algo``; ``KV_CACHE_QUANT_ALGO_LIST = [FP8, INT8, NVFP4]``.

:func:`checkpoint_problems` picks the classes the ``architecture`` needs (plus FP8 when
``quantization.quant_algo`` is ``"FP8"``) and lists every missing required key and wrong type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

TABLE_FILE = Path(__file__).with_name("checkpoint_fields.json")
_TYPES: dict[str, type | tuple[type, ...]] = {
    "int": int,
    "float": (int, float),
    "str": str,
    "bool": bool,
    "dict": dict,
    "list": list,
    "null": type(None),
}
_ALWAYS = ("Mapping", "QuantConfig")  # the sections every config class reads when present


@dataclass(frozen=True)
class ConfigClass:
    name: str
    file: str
    commit: str
    required: dict[str, str]  # key -> type, e.g. "int" or "str|null"
    optional: dict[str, str]
    section: str | None = None  # the sub-dict it reads (None: the config itself)
    closed: bool = False  # cls(**section): a key it does not declare raises TypeError
    nested: tuple[str, ...] = ()  # dicts read as configs of their own architecture
    values: dict[str, tuple[Any, ...]] | None = None

    @property
    def source(self) -> str:
        return f"{self.name}, {self.file} @ {self.commit[:10]}"


@dataclass(frozen=True)
class Contract:
    classes: dict[str, ConfigClass]
    architectures: dict[str, tuple[str, ...]]


@lru_cache(maxsize=1)
def load_contract() -> Contract:
    raw = json.loads(TABLE_FILE.read_text())
    classes = {
        name: ConfigClass(
            name=name,
            file=c["file"],
            commit=c["commit"],
            required=dict(c["required"]),
            optional={key: o["type"] for key, o in c["optional"].items()},
            section=c.get("section"),
            closed=c.get("closed", False),
            nested=tuple(c.get("nested", ())),
            values={key: tuple(v) for key, v in c.get("values", {}).items()},
        )
        for name, c in raw["classes"].items()
    }
    return Contract(classes, {arch: tuple(names) for arch, names in raw["architectures"].items()})


def type_ok(value: Any, spec: str) -> bool:
    """``value`` (parsed JSON) is one of the ``|``-joined types of ``spec``; a bool is no number."""
    return any(
        isinstance(value, _TYPES[name]) and not (isinstance(value, bool) and name in ("int", "float"))
        for name in spec.split("|")
    )


def checkpoint_problems(config: dict[str, Any], prefix: str = "") -> list[str]:
    """Every key trtllm-build 1.2 needs that ``config`` lacks, or holds with the wrong type."""
    contract = load_contract()
    arch = config.get("architecture")
    problems: list[str] = []
    if isinstance(arch, str) and arch not in contract.architectures:
        known = ", ".join(contract.architectures)
        problems.append(f"{prefix}architecture: {arch!r} is none of {known} (MODEL_MAP[architecture])")
    # An unknown or missing architecture is still checked against the base class.
    names = list(contract.architectures.get(arch, ()) if isinstance(arch, str) else ()) or ["PretrainedConfig"]
    names += _ALWAYS
    quantization = config.get("quantization")
    if isinstance(quantization, dict) and quantization.get("quant_algo") == "FP8":
        names.append("FP8")
    for name in names:
        cls = contract.classes[name]
        target = config if cls.section is None else config.get(cls.section)
        if isinstance(target, dict):  # a null section takes the defaults; a non-dict one is a type problem above
            where = prefix + (f"{cls.section}." if cls.section else "")
            problems += _class_problems(cls, target, where)
    return problems + _mapping_problems(config.get("mapping"), prefix)


def _class_problems(cls: ConfigClass, target: dict[str, Any], where: str) -> list[str]:
    problems = [
        f"{where}{key}: missing; {cls.source} reads it with no default" for key in cls.required if key not in target
    ]
    for key, spec in (cls.required | cls.optional).items():
        if key in target and not type_ok(target[key], spec):
            problems.append(f"{where}{key}: {target[key]!r} is not {spec} ({cls.source})")
    for key, allowed in (cls.values or {}).items():
        if key in target and target[key] not in allowed:
            problems.append(f"{where}{key}: {target[key]!r} is none of {list(allowed)} ({cls.source})")
    if cls.closed:
        for key in sorted(set(target) - set(cls.required) - set(cls.optional)):
            problems.append(f"{where}{key}: not a field of {cls.source}; {cls.name}(**{cls.section}) raises TypeError")
    for key in cls.nested:
        if isinstance(target.get(key), dict):
            problems += checkpoint_problems(target[key], prefix=f"{where}{key}.")
    return problems


def _mapping_problems(mapping: Any, prefix: str) -> list[str]:
    """MappingBase.__init__: ValueError unless world_size == tp_size * pp_size * cp_size (defaults 1)."""
    if not isinstance(mapping, dict):
        return []
    sizes = [mapping.get(key, 1) for key in ("world_size", "tp_size", "pp_size", "cp_size")]
    if not all(type_ok(size, "int") for size in sizes):
        return []  # already a type problem
    world, tp, pp, cp = sizes
    if world != tp * pp * cp:
        return [f"{prefix}mapping: world_size {world} != tp_size {tp} * pp_size {pp} * cp_size {cp} (Mapping raises)"]
    return []
