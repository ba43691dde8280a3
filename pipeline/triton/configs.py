"""The five ModelConfig messages of the in-flight-batching repository, built from the contract table.

Every tensor comes from :mod:`pipeline.triton.contract` (NVIDIA's templates, plus specdeploy's
marked extensions), so any client written for NVIDIA's repository works unchanged (a LoRA engine's
models withhold a client's own adapter unless the spec allows it: ``contract.CLIENT_ADAPTER_INPUTS``):

    text_input -> preprocessing (QUERY -> INPUT_ID ...) -> tensorrt_llm (input_ids ... -> output_ids)
               -> postprocessing (TOKENS_BATCH -> OUTPUT) -> text_output

``tensorrt_llm_bls`` serves the same API as the ensemble from a Python model that calls the
three models itself (NVIDIA ships one; clients select it with ``--model-name tensorrt_llm_bls``).
The ensemble's own name is served the same way by default (``ensemble: python``): the same code
with the ensemble's inputs and outputs and wiring, because Triton's ensemble scheduler never passes
a client's cancellation on to the running ``tensorrt_llm`` step (triton-inference-server/core#263);
``ensemble: triton`` emits NVIDIA's ``platform: "ensemble"`` instead.
This module decides only what is specdeploy's: batch sizes, instance counts, decoupling, the
parameters, the data types NVIDIA leaves to template variables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from pipeline.triton import contract
from pipeline.triton.contract import Tensor
from pipeline.triton.pbtxt import DTYPES, set_parameters

PREPROCESSING = "preprocessing"
TENSORRT_LLM = "tensorrt_llm"
POSTPROCESSING = "postprocessing"
BLS = "tensorrt_llm_bls"
# Parameter of the BLS-code models: the ensemble's steps, which they run themselves.
BLS_STEPS_PARAMETER = "specdeploy_steps"
ENSEMBLE_KINDS = ("python", "triton")
# Python stub processes per non-decoupled BLS-code model: requests beyond it wait (decoupled: no limit).
MAX_BLS_INSTANCES = 32


@dataclass(frozen=True)
class ModelNames:
    """The names of the models an ensemble is made of: NVIDIA's in a one-variant repository; in a
    whole-spec repository ``<variant>-tensorrt_llm`` and the like (see ``pipeline.triton.spec_repository``)."""

    preprocessing: str = PREPROCESSING
    tensorrt_llm: str = TENSORRT_LLM
    postprocessing: str = POSTPROCESSING
    bls: str = BLS

    def python_models(self) -> dict[str, str]:
        """Kind -> name of the Python models (their model.py comes from pipeline/triton/models/<kind>.py)."""
        return {PREPROCESSING: self.preprocessing, POSTPROCESSING: self.postprocessing, BLS: self.bls}


@dataclass(frozen=True)
class RepositorySettings:
    """Everything the configs need, read from the plan by ``repository.settings_from_plan``."""

    ensemble_name: str
    max_batch_size: int
    decoupled: bool
    lookahead: bool  # route per-request (W, N, G) through the ensemble's preprocessing
    preprocessing_instances: int
    postprocessing_instances: int
    max_queue_delay_microseconds: int
    preprocessing_parameters: dict[str, str]
    postprocessing_parameters: dict[str, str]
    tensorrt_llm_parameters: dict[str, str]
    bls_parameters: dict[str, str] = field(default_factory=dict)
    names: ModelNames = ModelNames()
    # A shared LoRA fine-tune's models: the task id they set (pipeline.lora.group).
    lora_task_id: int | None = None
    ensemble: str = "python"  # one of ENSEMBLE_KINDS
    # Data types of the contract's template variables where they differ from contract.VARIABLE_TYPES.
    variable_types: dict[str, str] = field(default_factory=dict)
    # False: the models withhold contract.CLIENT_ADAPTER_INPUTS (a LoRA engine, serving.lora_client_adapters off).
    client_adapters: bool = True

    @property
    def bls_instances(self) -> int:
        """Instances of the BLS-code models. A non-decoupled Python model handles one request per
        instance at a time (the Python backend runs async execute for decoupled models only), so they
        get one per batch slot, as NVIDIA's docs say for bls_instance_count, up to
        MAX_BLS_INSTANCES stub processes; a decoupled one runs a thread per request."""
        return 1 if self.decoupled else min(self.max_batch_size, MAX_BLS_INSTANCES)

    @property
    def preprocessing_sets_lora_task(self) -> bool:
        """Triton's ensemble cannot add a constant, so there the fine-tune's own preprocessing sets the
        task id; the Python models set it themselves, and the group's fine-tunes share preprocessing."""
        return self.lora_task_id is not None and self.ensemble == "triton"

    def python_sources(self) -> dict[str, str]:
        """Model name -> the kind whose model.py it runs (pipeline/triton/models/<kind>.py)."""
        sources = {name: kind for kind, name in self.names.python_models().items()}
        if self.ensemble == "python":
            sources[self.ensemble_name] = BLS
        return sources


def model_input(tensor: Tensor, variables: dict[str, str]) -> mc.ModelInput:
    message = mc.ModelInput(
        name=tensor.name,
        data_type=DTYPES[contract.data_type(tensor, variables)],
        dims=list(tensor.dims),
        optional=tensor.optional,
        allow_ragged_batch=tensor.ragged,
    )
    if tensor.reshape is not None:
        message.reshape.shape.extend(tensor.reshape)
        message.reshape.SetInParent()  # an empty shape is still a reshape: [1] -> []
    return message


def model_output(tensor: Tensor, variables: dict[str, str]) -> mc.ModelOutput:
    return mc.ModelOutput(
        name=tensor.name, data_type=DTYPES[contract.data_type(tensor, variables)], dims=list(tensor.dims)
    )


def _declare(config: mc.ModelConfig, model: str, settings: RepositorySettings) -> None:
    """The contract's tensors of ``model``, then specdeploy's extensions."""
    inputs, outputs = contract.declared(
        model, settings.lookahead, settings.preprocessing_sets_lora_task, settings.client_adapters
    )
    config.input.extend(model_input(t, settings.variable_types) for t in inputs)
    config.output.extend(model_output(t, settings.variable_types) for t in outputs)


def _python_model(name: str, settings: RepositorySettings, instances: int) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=settings.max_batch_size)
    config.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)
    return config


def preprocessing_config(settings: RepositorySettings) -> mc.ModelConfig:
    config = _python_model(settings.names.preprocessing, settings, settings.preprocessing_instances)
    # Requests queued while an instance is busy are handed over together (one Python call).
    config.dynamic_batching.SetInParent()
    _declare(config, PREPROCESSING, settings)
    set_parameters(config, settings.preprocessing_parameters)
    return config


def postprocessing_config(settings: RepositorySettings) -> mc.ModelConfig:
    config = _python_model(settings.names.postprocessing, settings, settings.postprocessing_instances)
    config.dynamic_batching.SetInParent()
    _declare(config, POSTPROCESSING, settings)
    set_parameters(config, settings.postprocessing_parameters)
    return config


def tensorrt_llm_config(settings: RepositorySettings) -> mc.ModelConfig:
    size = settings.max_batch_size
    config = mc.ModelConfig(name=settings.names.tensorrt_llm, backend="tensorrtllm", max_batch_size=size)
    config.model_transaction_policy.decoupled = settings.decoupled
    batching = config.dynamic_batching
    batching.preferred_batch_size.append(size)
    batching.max_queue_delay_microseconds = settings.max_queue_delay_microseconds
    batching.default_queue_policy.max_queue_size = 0  # unbounded; the backend reads it as maxQueueSize
    # One instance: the backend runs its own in-flight batcher across all requests (and all GPUs).
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    _declare(config, TENSORRT_LLM, settings)
    set_parameters(config, settings.tensorrt_llm_parameters)
    return config


def ensemble_steps(settings: RepositorySettings) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """(model, input_map, output_map) per step: NVIDIA's wiring plus the extensions' tensors."""
    pre_in, pre_out = dict(contract.PREPROCESSING_STEP_INPUTS), dict(contract.PREPROCESSING_STEP_OUTPUTS)
    llm_in = {
        inner: outer
        for inner, outer in contract.TENSORRT_LLM_STEP_INPUTS.items()
        if settings.client_adapters or inner not in contract.CLIENT_ADAPTER_INPUTS
    }
    if settings.lookahead:
        for outer in contract.LOOKAHEAD_CLIENT_INPUTS:
            inner = outer.upper()
            pre_in[inner] = outer
            pre_out[f"OUT_{inner}"] = f"_OUT_{inner}"
            llm_in[outer] = f"_OUT_{inner}"
    if settings.preprocessing_sets_lora_task:
        pre_in["LORA_TASK_ID"] = "lora_task_id"
        pre_out["OUT_LORA_TASK_ID"] = "_OUT_LORA_TASK_ID"
        llm_in["lora_task_id"] = "_OUT_LORA_TASK_ID"
    post_out = {**contract.POSTPROCESSING_STEP_OUTPUTS, "OUTPUT_TOKEN_COUNT": "text_output_tokens"}
    names = settings.names
    return [
        (names.preprocessing, pre_in, pre_out),
        (names.tensorrt_llm, llm_in, dict(contract.TENSORRT_LLM_STEP_OUTPUTS)),
        (names.postprocessing, dict(contract.POSTPROCESSING_STEP_INPUTS), post_out),
    ]


def ensemble_config(settings: RepositorySettings) -> mc.ModelConfig:
    config = mc.ModelConfig(name=settings.ensemble_name, platform="ensemble", max_batch_size=settings.max_batch_size)
    _declare(config, "ensemble", settings)
    for model, inputs, outputs in ensemble_steps(settings):
        step = config.ensemble_scheduling.step.add(model_name=model, model_version=-1)
        step.input_map.update(inputs)  # model tensor -> ensemble tensor
        step.output_map.update(outputs)
    return config


def bls_steps(settings: RepositorySettings, kind: str = BLS) -> list[dict]:
    """The ensemble's steps as a BLS-code model runs them, reading only tensors the model declares
    (``kind``: its contract key, ``tensorrt_llm_bls`` or ``ensemble``)."""
    declared = {
        t.name for t in contract.declared(kind, settings.lookahead, client_adapters=settings.client_adapters)[0]
    }
    steps = []
    for model, inputs, outputs in ensemble_steps(settings):
        kept = {inner: outer for inner, outer in inputs.items() if outer.startswith("_") or outer in declared}
        steps.append({"model": model, "inputs": kept, "outputs": outputs})
    return steps


def _bls_code_parameters(settings: RepositorySettings, kind: str) -> dict[str, str]:
    parameters = {
        "tensorrt_llm_model_name": settings.names.tensorrt_llm,
        BLS_STEPS_PARAMETER: json.dumps(bls_steps(settings, kind), separators=(",", ":")),
    }
    if settings.lora_task_id is not None:
        parameters["lora_task_id"] = str(settings.lora_task_id)
    return parameters


def bls_config(settings: RepositorySettings) -> mc.ModelConfig:
    config = _python_model(settings.names.bls, settings, settings.bls_instances)
    config.model_transaction_policy.decoupled = settings.decoupled
    _declare(config, BLS, settings)
    parameters = {
        "accumulate_tokens": "false",
        "tensorrt_llm_draft_model_name": "",
        "multimodal_encoders_name": "",
        **_bls_code_parameters(settings, BLS),
    }
    set_parameters(config, {**parameters, **settings.bls_parameters})
    return config


def python_ensemble_config(settings: RepositorySettings) -> mc.ModelConfig:
    """The ensemble's name, inputs and outputs, served by the BLS code running the ensemble's steps.

    Unlike NVIDIA's BLS it forwards ``num_return_sequences`` with beam search, as the ensemble's wiring does."""
    config = _python_model(settings.ensemble_name, settings, settings.bls_instances)
    config.model_transaction_policy.decoupled = settings.decoupled
    _declare(config, "ensemble", settings)
    parameters = _bls_code_parameters(settings, "ensemble") | {"specdeploy_forward_num_return_sequences": "true"}
    set_parameters(config, parameters)
    return config


def all_configs(settings: RepositorySettings) -> dict[str, mc.ModelConfig]:
    """Model directory name -> config (every directory is named after its model)."""
    names = settings.names
    if settings.ensemble not in ENSEMBLE_KINDS:
        raise ValueError(f"ensemble must be one of {ENSEMBLE_KINDS}, not {settings.ensemble!r}")
    front = python_ensemble_config if settings.ensemble == "python" else ensemble_config
    return {
        settings.ensemble_name: front(settings),
        names.preprocessing: preprocessing_config(settings),
        names.tensorrt_llm: tensorrt_llm_config(settings),
        names.postprocessing: postprocessing_config(settings),
        names.bls: bls_config(settings),
    }
