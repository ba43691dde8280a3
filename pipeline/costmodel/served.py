"""What a Triton model repository serves, as the cost model needs it: the method and its settings, the
engine's shape, dtypes and parallelism. ``specdeploy bench --repository DIR`` records it beside its
measurements, so that ``specdeploy calibrate`` can price each run.

    >>> served = describe(Path("triton_repo/smollm2-medusa"))  # doctest: +SKIP
    >>> served["method"], served["settings"]["medusa_choices"][:2]  # doctest: +SKIP
    ('medusa', [[0], [1]])

Read from the repository's ``tensorrt_llm/config.pbtxt`` (decoding_mode, the choices, Lookahead's
(W, N, G), the reference backend's EAGLE-2 keys) and the engine's ``config.json`` it points at
(pretrained_config: the geometry, dtype and quantization; build_config: speculative_decoding_mode).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline import methods
from pipeline.costmodel.step import Dtype
from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.methods.base import MethodDefinition
from pipeline.methods.drafting import Drafting


def _tensorrt_llm_config(repository: Path) -> Path:
    found = sorted(repository.glob("*tensorrt_llm/config.pbtxt"))
    found = [p for p in found if p.parent.name.endswith("tensorrt_llm") and "bls" not in p.parent.name]
    if len(found) != 1:
        raise InputError(
            f"{repository}: expected one tensorrt_llm model (a repository `specdeploy engine` packaged), "
            f"found {len(found)}; give one variant's repository"
        )
    return found[0]


def describe(repository: Path) -> dict[str, Any]:
    """The served method, its settings and the engine's shape (JSON-able; see the module)."""
    from pipeline.runtime.spec_decode.factory import served_method
    from pipeline.runtime.triton.io import parse_parameters
    from pipeline.triton import pbtxt

    config_path = _tensorrt_llm_config(repository)
    try:
        config = pbtxt.load(config_path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{config_path}: cannot read the model config ({exc})") from None
    from google.protobuf.json_format import MessageToDict

    params = parse_parameters(MessageToDict(config, preserving_proto_field_name=True), config_path.parent)
    engine_config = params.engine_dir / "config.json"
    try:
        engine = json.loads(engine_config.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{engine_config}: cannot read the engine's config ({exc})") from None
    pc = engine.get("pretrained_config") or {}
    build = engine.get("build_config") or {}
    arch = ModelGeometry.from_trtllm(pc, str(engine_config))
    quant = pc.get("quantization") or {}
    mapping = pc.get("mapping") or {}
    method = served_method(build.get("speculative_decoding_mode"), params.method, config_path)
    settings: dict[str, Any] = {"max_draft_len": int(build.get("max_draft_len") or 0)}
    definition = _definition(method)
    if definition is not None and definition.served_settings is not None:
        settings |= definition.served_settings(params.method, pc, config_path)
    return {
        "repository": str(repository.resolve()),
        "engine_dir": str(params.engine_dir),
        "method": method,
        "settings": settings,
        "arch": arch.to_dict(),
        # what the engine holds (float32 for the CPU reference engines), not what the cost model prices
        "dtype": "fp8" if quant.get("quant_algo") == "FP8" else str(pc.get("dtype") or "bfloat16"),
        "kv_dtype": "fp8" if quant.get("kv_cache_quant_algo") == "FP8" else str(pc.get("dtype") or "bfloat16"),
        "tp": int(mapping.get("tp_size") or 1),
        "pp": int(mapping.get("pp_size") or 1),
    }


def drafting(served: dict[str, Any]) -> Drafting:
    """What the cost model charges for the served method (the inverse of :func:`describe`)."""
    method, settings = served["method"], served["settings"]
    definition = _definition(method)
    if definition is None or definition.served_drafting is None:
        raise ValueError(f"the cost model has no method {method!r}")
    return definition.served_drafting(settings)


def _definition(method: str) -> MethodDefinition | None:
    """The definition of a served method; None for a build mode no method has (served, not priced)."""
    return next((d for d in methods.definitions() if d.name == method), None)


def priced_dtype(recorded: str) -> Dtype:
    """The dtype the cost model prices a recorded engine dtype at: FP8, or 16-bit for the rest (the GPU
    roofline knows no float32 engine; the CPU profile reads no dtype)."""
    return "fp8" if recorded == "fp8" else "bfloat16"
