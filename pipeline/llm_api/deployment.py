"""The package stage of the PyTorch-backend target: what ``trtllm-serve`` (and Triton's ``llmapi`` model)
needs to serve a variant, written into ``triton_repo/<variant>/``:

* ``extra_llm_api_options.yaml``: the LLM API arguments (:mod:`pipeline.llm_api.options`);
* ``serve.json``: the ``trtllm-serve`` argv with every path where the deployment mounts it, the
  server's health endpoint, and for a LoRA group each fine-tune's ``lora_request`` (the body field
  TensorRT-LLM's OpenAI-compatible server reads per request: ``lora_name``, ``lora_int_id``,
  ``lora_path``);
* ``llmapi/tensorrt_llm/1/model.yaml``: the same arguments for Triton's ``llmapi`` model, only for a
  variant without fine-tunes on it: that model's ``model.py`` calls ``generate_async`` without a
  ``lora_request`` (see pipeline/targets/pytorch_sources.json), so a fine-tune behind it would be
  answered by the base, and is not offered there.

The model folder and the adapters stay where the checkpoint and lora stages wrote them
(``<engines>/<variant>/checkpoint``, ``.../lora/<task id>``); the files here name them at
``deploy.mount_path``, so the release is relocatable like the engine target's.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from pipeline.llm_api.options import BACKEND, llm_api_options
from pipeline.plan.types import StagePlan, VariantPlan
from pipeline.spec.deploy import TRITON_REPO_FOLDER

OPTIONS_FILE = "extra_llm_api_options.yaml"
DRAFTER_FOLDER = "eagle3"  # an EAGLE-3 drafter, beside the model it drafts for: <checkpoint>/eagle3/
SERVE_FILE = "serve.json"
LLMAPI_MODEL_YAML = PurePosixPath("llmapi/tensorrt_llm/1/model.yaml")
HEALTH_PATH = "/health"  # trtllm-serve's liveness endpoint (tensorrt_llm/serve/openai_server.py)


def deployed(engines_root: PurePosixPath, built: Path) -> PurePosixPath:
    """Where the deployment mounts ``<engines>/<variant>/<folder>``."""
    return engines_root / built.parent.name / built.name


def serve_argv(model: PurePosixPath, options: PurePosixPath, host: str, port: int) -> list[str]:
    """``trtllm-serve MODEL --backend pytorch --host H --port P --extra_llm_api_options FILE``."""
    return [
        "trtllm-serve",
        str(model),
        "--backend",
        BACKEND,
        "--host",
        host,
        "--port",
        str(port),
        "--extra_llm_api_options",
        str(options),
    ]


def lora_members(package: StagePlan) -> dict[str, int]:
    """A LoRA group engine's fine-tunes, by name: their task ids (none for any other variant)."""
    return (package.params.get("lora") or {}).get("members", {})


def fine_tunes(package: StagePlan, adapters_root: PurePosixPath) -> dict[str, dict[str, Any]]:
    """Each fine-tune of a LoRA group by name: the ``lora_request`` a client sends to reach it."""
    return {
        name: {"lora_name": name, "lora_int_id": task_id, "lora_path": str(adapters_root / str(task_id))}
        for name, task_id in sorted(lora_members(package).items())
    }


def launch_argv(variant: VariantPlan, port: int | None = None) -> list[str]:
    """The ``trtllm-serve`` argv of this variant's deployment, every path where the deployment mounts it
    (``port``: where it listens, default the variant's ``serving.http_port``)."""
    package = variant.stage("package")
    engines_root = PurePosixPath(package.params["engines_root"])
    repository = engines_root.parent / TRITON_REPO_FOLDER / Path(package.output).name
    model = deployed(engines_root, Path(package.inputs["checkpoint"]))
    return serve_argv(model, repository / OPTIONS_FILE, variant.serving.host, port or variant.serving.http_port)


def emit_deployment(variant: VariantPlan, package: StagePlan, out: Path) -> None:
    """Write the variant's runtime configuration into ``out`` (the package stage's temp folder)."""
    engines_root = PurePosixPath(package.params["engines_root"])
    model = deployed(engines_root, Path(package.inputs["checkpoint"]))
    adapters_root = model.parent / "lora"
    options = llm_api_options(variant, package, adapters_root, model / DRAFTER_FOLDER)
    (out / OPTIONS_FILE).write_text(yaml.safe_dump(options, sort_keys=False), encoding="utf-8")
    tunes = fine_tunes(package, adapters_root)
    serve: dict[str, Any] = {
        "argv": launch_argv(variant),
        "model": str(model),
        "health": HEALTH_PATH,
        "port": variant.serving.http_port,
        "fine_tunes": tunes,
    }
    if package.params.get("lora_task_id") is not None:  # a shared fine-tune's own package: its name
        serve["fine_tune"] = variant.name
    (out / SERVE_FILE).write_text(json.dumps(serve, indent=1) + "\n", encoding="utf-8")
    if not tunes:
        triton = {"max_batch_size": 0, "decoupled": True}  # NVIDIA's template: the model batches inside the LLM API
        model_yaml = {"model": str(model), "backend": BACKEND, **options, "triton_config": triton}
        path = out / LLMAPI_MODEL_YAML
        path.parent.mkdir(parents=True)
        path.write_text(yaml.safe_dump(model_yaml, sort_keys=False), encoding="utf-8")
