"""Emit ``triton_repo/<variant>/``: the model repository one tritonserver loads.

Layout (identical for the CPU reference backend and a GPU server)::

    <out>/<ensemble>/config.pbtxt, 1/model.py  the client-facing API: the BLS code running the
                                               ensemble's steps (serving.ensemble: python), or
                                               platform ensemble, NVIDIA's (serving.ensemble: triton)
    <out>/preprocessing/config.pbtxt, 1/model.py, 1/specdeploy_tokenizer.py, tokenizer/
    <out>/tensorrt_llm/config.pbtxt, 1/        backend "tensorrtllm", gpt_model_path = the engine
    <out>/postprocessing/config.pbtxt, 1/model.py, 1/specdeploy_tokenizer.py, tokenizer/
    <out>/tensorrt_llm_bls/config.pbtxt, 1/model.py  the ensemble's API as one Python (BLS) model
    <out>/specdeploy-repository.json           what was packaged (for `serve` and humans)

A Python model's code is its ``model.py`` and the helper modules it imports from its version folder
(``MODEL_HELPERS``: Triton's Python backend puts that folder on ``sys.path``), all copied from
pipeline/triton/models/: the models never import ``pipeline``.

The tokenizer is copied into each Python model's folder and referenced as ``tokenizer``
relative to it: Triton treats every folder at the repository root as a model (a root-level
``tokenizer/`` fails the whole server), and a relative path survives moving the repository,
including the runner's rename from its temp folder. The second copy is a hard link when the
filesystem allows. The engine is far too big to copy: ``gpt_model_path`` names it where the
deployment mounts it (``deploy.mount_path``, what NVIDIA's backend reads) and ``reference_engine_path``
relative to the model's folder (what the CPU reference backend falls back to); nothing names the
build machine's absolute paths, so the repository can move (:mod:`pipeline.triton.relocate`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.client.chat import template_parameter
from pipeline.errors import InputError, StageError
from pipeline.lora.rules import lora_weights_data_type
from pipeline.plan.types import VariantPlan
from pipeline.triton import pbtxt
from pipeline.triton.backend_params import (
    check_parameters,
    client_adapters,
    gpu_device_ids,
    tensorrt_llm_parameters,
)
from pipeline.triton.configs import (
    BLS,
    BLS_STEPS_PARAMETER,
    POSTPROCESSING,
    PREPROCESSING,
    TENSORRT_LLM,
    RepositorySettings,
    all_configs,
)
from pipeline.triton.contract import LORA_WEIGHTS

MODELS_SOURCE = Path(__file__).parent / "models"
TOKENIZER_SUBDIR = "tokenizer"
MANIFEST = "specdeploy-repository.json"
PYTHON_MODELS = (PREPROCESSING, POSTPROCESSING, BLS)  # model.py copied from pipeline/triton/models/
# The helper modules (pipeline/triton/models/) a kind's model.py imports: copied beside it into 1/.
MODEL_HELPERS: dict[str, tuple[str, ...]] = {
    PREPROCESSING: ("specdeploy_tokenizer.py",),
    POSTPROCESSING: ("specdeploy_tokenizer.py",),
}
# Files a Hugging Face tokenizer may need; never weights. config.json lets AutoTokenizer pick
# the class when tokenizer_config.json does not name one.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "config.json",
)
TOKENIZER_REQUIRED = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json")  # one of them


def settings_from_plan(variant: VariantPlan, engine_dir: Path, repository: Path) -> RepositorySettings:
    """The configs' settings for ``engine_dir``, packaged into ``repository``."""
    serving, build, look = variant.serving, variant.build, variant.speculative.lookahead
    if serving.model_name in (PREPROCESSING, TENSORRT_LLM, POSTPROCESSING, BLS):
        raise InputError(
            f"[{variant.name}] serving.model_name '{serving.model_name}' collides with a model of the "
            "repository; pick another name (default: ensemble)"
        )
    # multimodal_model_path: NVIDIA's preprocessing reads it without a fallback ("" is text only).
    pre = {
        "tokenizer_dir": TOKENIZER_SUBDIR,
        "add_special_tokens": "true",
        "max_input_len": str(build.max_input_len),
        "multimodal_model_path": "",
    }
    if look is not None:  # preprocessing fills and bounds the per-request (W, N, G)
        pre.update(look.triton_parameters())
    return RepositorySettings(
        ensemble_name=serving.model_name,
        max_batch_size=build.max_batch_size,
        decoupled=serving.decoupled,
        ensemble=serving.ensemble,
        lookahead=look is not None,
        preprocessing_instances=serving.preprocessing_instances,
        postprocessing_instances=serving.postprocessing_instances,
        max_queue_delay_microseconds=serving.max_queue_delay_microseconds,
        preprocessing_parameters=pre,
        postprocessing_parameters={"tokenizer_dir": TOKENIZER_SUBDIR, "skip_special_tokens": "true"},
        tensorrt_llm_parameters=tensorrt_llm_parameters(variant, engine_dir, repository),
        variable_types={LORA_WEIGHTS: lora_weights_data_type(variant.build.dtype)},
        client_adapters=client_adapters(variant),
    )


def check_engine(variant: VariantPlan, engine_dir: Path) -> dict[str, Any]:
    """The engine must be the one the plan describes: the server's values are the plan's (#710, #473)."""
    path = Path(engine_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise StageError(
            f"[{variant.name}] {path}: no engine here; run the build stage first "
            f"(`specdeploy engine SPEC --variant {variant.name}`)"
        ) from None
    except ValueError as exc:
        raise StageError(f"[{variant.name}] {path}: not JSON ({exc})") from None
    build = config.get("build_config", {})
    mapping = config.get("pretrained_config", {}).get("mapping", {})
    expected = {
        ("build_config", "max_batch_size"): (build.get("max_batch_size"), variant.build.max_batch_size),
        ("build_config", "max_draft_len"): (build.get("max_draft_len"), variant.build.max_draft_len),
        ("mapping", "tp_size"): (mapping.get("tp_size"), variant.tp),
        ("mapping", "pp_size"): (mapping.get("pp_size"), variant.pp),
    }
    wrong = [
        f"{'.'.join(key)} is {got}, the plan says {want}"
        for key, (got, want) in expected.items()
        if got is not None and got != want
    ]
    if wrong:
        raise StageError(
            f"[{variant.name}] {path}: engine does not match the plan ({'; '.join(wrong)}); "
            "rebuild it (`specdeploy engine SPEC --force`)"
        )
    return config


def copy_tokenizer(source: Path, target: Path) -> list[str]:
    files = [name for name in TOKENIZER_FILES if (Path(source) / name).is_file()]
    if not any(name in files for name in TOKENIZER_REQUIRED):
        raise StageError(
            f"{source}: no tokenizer files (tokenizer.json, tokenizer.model, vocab.json); the "
            "pre/postprocessing models need the model's tokenizer"
        )
    target.mkdir(parents=True, exist_ok=True)
    for name in files:
        shutil.copyfile(Path(source) / name, target / name)
    return files


def with_chat_template(settings: RepositorySettings, tokenizer: Path, source: Path | None = None) -> RepositorySettings:
    """The chat template travels in the served preprocessing config: `specdeploy query` asks the server for it.
    ``source``: the folder the error names (the tokenizer's origin, when ``tokenizer`` is a copy)."""
    add_special = settings.preprocessing_parameters["add_special_tokens"] == "true"
    try:
        template = template_parameter(tokenizer, add_special)
    except (OSError, ValueError) as exc:
        shown = source or tokenizer
        raise StageError(f"{shown}: the tokenizer does not load ({' '.join(str(exc).split())})") from None
    return replace(settings, preprocessing_parameters={**settings.preprocessing_parameters, **template})


def model_code(kind: str) -> dict[str, Path]:
    """The code of a kind of Python model: file name in its version folder -> source."""
    return {"model.py": MODELS_SOURCE / f"{kind}.py"} | {
        helper: MODELS_SOURCE / helper for helper in MODEL_HELPERS.get(kind, ())
    }


def write_models(configs: dict[str, pbtxt.ModelConfig], settings: RepositorySettings, out: Path) -> None:
    """Each config with its version folder, and the code (model.py and helpers) of the Python models
    among them (tokenizers are the caller's)."""
    for name, config in configs.items():
        pbtxt.write(config, out / name / "config.pbtxt")
        (out / name / "1").mkdir(parents=True, exist_ok=True)  # Triton needs a version folder
    for name, kind in settings.python_sources().items():
        if name in configs:
            for file, source in model_code(kind).items():
                shutil.copyfile(source, out / name / "1" / file)


def with_lora_task(settings: RepositorySettings, task_id: int) -> RepositorySettings:
    """A shared LoRA fine-tune's settings: its models set ``task_id`` on each request (with Triton's
    ensemble, its preprocessing does)."""
    settings = replace(settings, lora_task_id=task_id)
    if settings.preprocessing_sets_lora_task:
        settings = replace(
            settings, preprocessing_parameters=settings.preprocessing_parameters | {"lora_task_id": str(task_id)}
        )
    return settings


def _link_tree(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        try:
            os.link(file, target / file.name)
        except OSError:  # another filesystem, or links not allowed
            shutil.copyfile(file, target / file.name)


def emit_repository(
    variant: VariantPlan,
    out: Path,
    *,
    engine_dir: Path,
    tokenizer_dir: Path | None,
    check_engine_config: bool = True,
    lora_task_id: int | None = None,
) -> dict[str, pbtxt.ModelConfig]:
    """Write the repository into ``out`` (an empty or new folder) and return the configs written.

    ``tokenizer_dir`` None: a repository to review (``build --dry-run --repository``) on a host
    without the weights: no tokenizer copies, and no chat template (which is read from the tokenizer);
    ``lora_task_id``: a shared LoRA fine-tune's repository, whose models set that task id."""
    out = Path(out)
    if check_engine_config:
        check_engine(variant, engine_dir)
    settings = settings_from_plan(variant, engine_dir, out)
    files: list[str] = []
    if tokenizer_dir is not None:
        files = copy_tokenizer(tokenizer_dir, out / PREPROCESSING / TOKENIZER_SUBDIR)
        _link_tree(out / PREPROCESSING / TOKENIZER_SUBDIR, out / POSTPROCESSING / TOKENIZER_SUBDIR)
        settings = with_chat_template(settings, out / PREPROCESSING / TOKENIZER_SUBDIR, source=tokenizer_dir)
    if lora_task_id is not None:
        settings = with_lora_task(settings, lora_task_id)
    configs = all_configs(settings)
    write_models(configs, settings, out)
    manifest = {
        "variant": variant.name,
        "method": variant.method,
        "target": variant.target,
        "ensemble": settings.ensemble_name,
        # Where the deployment has the engines (gpt_model_path is under it); see pipeline/triton/relocate.py.
        "engines_root": str(variant.deploy.engines_root),
        "engine_dir": settings.tensorrt_llm_parameters["gpt_model_path"],
        "tp": variant.tp,
        "pp": variant.pp,
        "world_size": variant.world_size,
        "gpu_device_ids": gpu_device_ids(variant),
        "decoupled": settings.decoupled,
        "max_batch_size": settings.max_batch_size,
        "max_input_len": variant.build.max_input_len,
        "tokenizer": f"{PREPROCESSING}/{TOKENIZER_SUBDIR}",
        "tokenizer_files": files,
        "ports": {
            "grpc": variant.serving.grpc_port,
            "http": variant.serving.http_port,
            "metrics": variant.serving.metrics_port,
        },
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    validate_repository(out)
    return configs


def stale_models(repo: Path) -> list[str]:
    """Python models whose code (model.py, helpers) differs from this specdeploy's (packaged by another
    version), and kinds of Python model the repository lacks (packaged before they existed).

    The stage fingerprint covers the plan and the inputs, not this package's own code."""
    folders = sorted(path for path in Path(repo).iterdir() if path.is_dir())
    stale = []
    for kind in PYTHON_MODELS:
        sources = {file: source.read_bytes() for file, source in model_code(kind).items()}
        models = [path for path in folders if path.name == kind or path.name.endswith(f"-{kind}")]
        if not models:
            stale.append(kind)
        if kind == BLS:  # the Python ensembles run the BLS code too
            models += [path for path in folders if path not in models and _runs_bls_code(path)]
        for model in models:
            if any(not _same_file(model / "1" / file, source) for file, source in sources.items()):
                stale.append(model.name)
    return stale


def _same_file(packaged: Path, source: bytes) -> bool:
    return packaged.is_file() and packaged.read_bytes() == source


def _runs_bls_code(model: Path) -> bool:
    try:
        text = (model / "config.pbtxt").read_text(errors="replace")
    except OSError:
        return False
    return 'backend: "python"' in text and f'key: "{BLS_STEPS_PARAMETER}"' in text


def validate_repository(repo: Path) -> dict[str, pbtxt.ModelConfig]:
    """Parse every config.pbtxt back and check what Triton would only report at load time."""
    repo = Path(repo)
    configs: dict[str, pbtxt.ModelConfig] = {}
    for path in sorted(repo.glob("*/config.pbtxt")):
        text = path.read_text()
        if "${" in text:
            raise StageError(f"{path}: unfilled ${{...}} placeholder")
        config = pbtxt.parse(text, path)
        if config.name != path.parent.name:
            raise StageError(f"{path}: name '{config.name}' differs from its folder '{path.parent.name}'")
        if not (path.parent / "1").is_dir():
            raise StageError(f"{path.parent}: no version folder 1/")
        configs[config.name] = config
    runners = {name: steps for name, config in configs.items() if (steps := model_steps(config, repo)) is not None}
    if not any(name != BLS and not name.endswith(f"-{BLS}") for name in runners):
        raise StageError(f"{repo}: no ensemble model (not a packaged repository; run `specdeploy engine SPEC`)")
    # tensorrt_llm_bls is not required: a repository packaged before it existed is reported stale instead.
    missing = {step[0] for steps in runners.values() for step in steps} - set(configs)
    if missing:
        raise StageError(f"{repo}: models missing: {', '.join(sorted(missing))}")
    for config in configs.values():
        if config.backend == "tensorrtllm":
            check_parameters(pbtxt.parameters(config))
    for name, steps in runners.items():
        _check_steps(configs[name], steps, configs, repo)
    return configs


Step = tuple[str, dict[str, str], dict[str, str]]  # (model, its input -> the ensemble's tensor, output -> tensor)


def model_steps(config: pbtxt.ModelConfig, repo: Path) -> list[Step] | None:
    """The steps a model runs: a Triton ensemble's, or a BLS-code model's ``specdeploy_steps``; None for others."""
    if config.platform == "ensemble":
        return [(s.model_name, dict(s.input_map), dict(s.output_map)) for s in config.ensemble_scheduling.step]
    value = pbtxt.parameters(config).get(BLS_STEPS_PARAMETER)
    if config.backend != "python" or value is None:
        return None
    try:
        return [(step["model"], dict(step["inputs"]), dict(step["outputs"])) for step in json.loads(value)]
    except (ValueError, KeyError, TypeError) as exc:
        raise StageError(
            f"{repo}/{config.name}: parameter {BLS_STEPS_PARAMETER} is not a list of steps ({exc})"
        ) from None


def _check_steps(
    front: pbtxt.ModelConfig, steps: list[Step], configs: dict[str, pbtxt.ModelConfig], repo: Path
) -> None:
    """Every mapped name exists on both sides, and every step input is produced before it is read."""
    available = {tensor.name for tensor in front.input}
    for name, input_map, output_map in steps:
        model = configs.get(name)
        if model is None:
            raise StageError(f"{repo}: {front.name}'s step names unknown model '{name}'")
        model_inputs = {t.name: t for t in model.input}
        for inner, outer in input_map.items():
            if inner not in model_inputs:
                raise StageError(f"{repo}: {name} has no input '{inner}'")
            if outer not in available:
                raise StageError(f"{repo}: {name}.{inner} reads '{outer}', which nothing produces first")
        required = {tensor for tensor, t in model_inputs.items() if not t.optional}
        if required - set(input_map):
            raise StageError(
                f"{repo}: {name} required inputs not mapped: {', '.join(sorted(required - set(input_map)))}"
            )
        model_outputs = {t.name for t in model.output}
        for inner, outer in output_map.items():
            if inner not in model_outputs:
                raise StageError(f"{repo}: {name} has no output '{inner}'")
            available.add(outer)
    missing = {t.name for t in front.output} - available
    if missing:
        raise StageError(f"{repo}: {front.name} outputs never produced: {', '.join(sorted(missing))}")
