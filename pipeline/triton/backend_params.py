"""The ``parameters`` of the ``tensorrt_llm`` model: what the TensorRT-LLM backend reads, from the plan.

The C++ backend silently ignores a key it does not know (a typo means a default is used, and
a Lookahead model then dies at load with ``Assertion failed: 16 != 40``, tensorrtllm_backend#710),
throws for a key it requires that is missing (``tokenizer_dir`` and the other guided-decoding keys
are read outside any ``try``: no model instance would be created), and quietly uses a default for a
value that does not parse. So the parameters are held to the backend's own reads
(:mod:`pipeline.triton.backend_reads`, extracted from its sources): every key one it reads, every
key it requires present, every value parsing as it parses it; and every value comes from the plan,
never recomputed.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from pipeline import methods, targets
from pipeline.errors import StageError
from pipeline.plan.types import VariantPlan
from pipeline.triton.backend_reads import parameter_problems

# Read without a fallback on every instance's creation (getGuidedDecodingConfigFromParams); "" means
# "not set": specdeploy's engines do no guided decoding (the C++ workflow would need xgrammar's
# tokenizer info file, not a tokenizer folder).
GUIDED_DECODING_UNSET = {"tokenizer_dir": "", "xgrammar_tokenizer_info_path": "", "guided_decoding_backend": ""}


def _bool(value: bool) -> str:
    return "true" if value else "false"  # the C++ backend accepts true/false (and True/1/...)


def gpu_device_ids(variant: VariantPlan) -> list[int]:
    """One GPU per rank: the spec's list, else 0..tp*pp-1 (the plan already checked the length)."""
    ids = variant.serving.gpu_device_ids
    return list(ids) if ids is not None else list(range(variant.world_size))


def deployed_path(variant: VariantPlan, folder: Path) -> PurePosixPath:
    """``folder`` where the deployment mounts the engines root (deploy.mount_path): ``gpt_model_path``
    for the engine, ``lora_prefetch_dir`` for a LoRA group's adapters.

    The engines root holds ``<variant>/engine`` and ``<variant>/lora`` (the plan's layout), so the
    path keeps the folder's last two parts: ``/models/engines/base/engine`` for ``engines/base/engine``. Absolute:
    the C++ backend reads it as given (a relative one resolves against the server's working
    directory); ``specdeploy serve`` elsewhere rewrites both against ``--engines-dir``
    (:mod:`pipeline.triton.relocate`).
    """
    folder = Path(folder)
    return variant.deploy.engines_root / folder.parent.name / folder.name


def packaged_path(folder: Path, repository: Path) -> str:
    """``folder`` (an engine, a LoRA group's adapters) relative to a model folder of ``repository``
    (all sit one level down): where the CPU reference backend looks when the deployed path holds
    nothing (``reference_engine_path``, ``reference_lora_prefetch_path``). It holds wherever the
    engines and Triton repository roots move together."""
    model_folder = Path(repository).resolve() / "model"
    return os.path.relpath(Path(folder).resolve(), model_folder)


def client_adapters(variant: VariantPlan) -> bool:
    """Whether the variant's models take a client's own adapter: declare its inputs (the configs) and
    store it (the reference backend's ``reference_lora_client_adapters``).

    A LoRA engine's variant does only with ``serving.lora_client_adapters``; a shared fine-tune's models
    never (they set its own task id, whose adapter is prefetched); an engine without LoRA keeps NVIDIA's
    declaration (its backend answers such a request with an error)."""
    package = variant.stage("package").params
    if not package.get("lora"):
        return True
    return variant.serving.lora_client_adapters and package.get("lora_task_id") is None


def lora_parameters(variant: VariantPlan, repository: Path) -> dict[str, str]:
    """A LoRA group's engine: its cache sizes and ``lora_prefetch_dir`` (where the deployment mounts
    the adapters, as ``gpt_model_path``), as the plan's package stage carries them; none otherwise."""
    stage = variant.stage("package")
    params = dict(stage.params.get("lora") or {})
    if params and not targets.on_gpus(variant.target):
        params["reference_lora_prefetch_path"] = packaged_path(stage.inputs["lora"], repository)
        params["reference_lora_client_adapters"] = _bool(client_adapters(variant))
    return params


def tensorrt_llm_parameters(variant: VariantPlan, engine_dir: Path, repository: Path) -> dict[str, str]:
    """The tensorrt_llm model's parameters for ``engine_dir``, packaged into ``repository``."""
    spec = variant.speculative
    params = {
        "max_beam_width": str(variant.build.max_beam_width),
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": str(deployed_path(variant, engine_dir)),
        "batch_scheduler_policy": variant.serving.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": repr(float(variant.serving.kv_cache_free_gpu_mem_fraction)),
        "enable_kv_cache_reuse": _bool(variant.serving.enable_kv_cache_reuse),
        # Clients want the completion; a request can still ask for the prompt back.
        "exclude_input_in_output": "true",
        "enable_chunked_context": "false",
        "gpu_device_ids": ",".join(str(i) for i in gpu_device_ids(variant)),
        "decoding_mode": methods.definition(spec.method).triton_decoding_mode,
        **GUIDED_DECODING_UNSET,
    }
    if not targets.on_gpus(variant.target):  # the GPU backend has no use for it
        params["reference_engine_path"] = packaged_path(engine_dir, repository)
    own = getattr(spec.config, "triton_parameters", None)  # the method's own parameters, as its config says them
    if own is not None:
        params.update(own())
    params.update(lora_parameters(variant, repository))
    check_parameters(params)
    return params


# The CPU reference backend's own parameters (the C++ backend ignores keys it does not know).
REFERENCE_BACKEND_KEYS = (
    "reference_num_threads",
    "reference_engine_path",
    "reference_lora_prefetch_path",
    "reference_lora_client_adapters",
)


def reference_parameter_keys() -> frozenset[str]:
    """Parameters only the CPU reference backend reads: its own, and each method's
    (MethodDefinition.reference_parameter_keys), asked of the definitions when called."""
    return frozenset(REFERENCE_BACKEND_KEYS).union(*(d.reference_parameter_keys for d in methods.definitions()))


def check_parameters(params: dict[str, str]) -> None:
    """StageError listing every way ``params`` would fail or misconfigure the C++ backend."""
    problems = parameter_problems(params, extra_keys=reference_parameter_keys())
    if problems:
        raise StageError(f"tensorrt_llm parameters the TensorRT-LLM backend would not accept: {'; '.join(problems)}")
