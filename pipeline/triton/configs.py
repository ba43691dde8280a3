"""The four ModelConfig messages of the in-flight-batching repository, and the ensemble wiring.

Names and mappings follow TensorRT-LLM's ``inflight_batcher_llm`` layout
(NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/) so that any client written for it works unchanged:

    text_input -> preprocessing (QUERY -> INPUT_ID ...) -> tensorrt_llm (input_ids ... -> output_ids)
               -> postprocessing (TOKENS_BATCH -> OUTPUT) -> text_output

Every request-level tensor is optional except ``text_input`` and ``max_tokens``. Lookahead
models also route the three per-request (W, N, G) tensors through preprocessing, which fills
the server's values when a client omits them (a request without them fails on some
backend versions, tensorrtllm_backend#711) and rejects values above what the engine was built for.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from pipeline.triton.pbtxt import model_input, model_output, set_parameters

PREPROCESSING = "preprocessing"
TENSORRT_LLM = "tensorrt_llm"
POSTPROCESSING = "postprocessing"

# (ensemble input, dtype, tensorrt_llm input): request options passed straight to the backend.
SAMPLING_INPUTS: tuple[tuple[str, str, str], ...] = (
    ("top_k", "INT32", "runtime_top_k"),
    ("top_p", "FP32", "runtime_top_p"),
    ("temperature", "FP32", "temperature"),
    ("repetition_penalty", "FP32", "repetition_penalty"),
    ("presence_penalty", "FP32", "presence_penalty"),
    ("frequency_penalty", "FP32", "frequency_penalty"),
    ("min_tokens", "INT32", "min_tokens"),
    ("seed", "UINT64", "seed"),
    ("return_log_probs", "BOOL", "return_log_probs"),
    ("return_perf_metrics", "BOOL", "return_perf_metrics"),
    ("exclude_input_in_output", "BOOL", "exclude_input_in_output"),
    ("stream", "BOOL", "streaming"),
)

# (tensorrt_llm output = ensemble output, dtype, dims): passed straight back to the client.
PASSTHROUGH_OUTPUTS: tuple[tuple[str, str, list[int]], ...] = (
    ("cum_log_probs", "FP32", [-1]),
    ("output_log_probs", "FP32", [-1, -1]),
    ("acceptance_rate", "FP32", [1]),
    ("total_accepted_draft_tokens", "INT32", [1]),
    ("total_draft_tokens", "INT32", [1]),
    ("kv_cache_alloc_new_blocks", "INT32", [1]),
    ("kv_cache_reused_blocks", "INT32", [1]),
    ("kv_cache_alloc_total_blocks", "INT32", [1]),
    ("arrival_time_ns", "INT64", [1]),
    ("first_scheduled_time_ns", "INT64", [1]),
    ("first_token_time_ns", "INT64", [1]),
    ("last_token_time_ns", "INT64", [1]),
)

# Preprocessing: per-request lookahead (W, N, G) in and out, and the tensorrt_llm input each feeds.
LOOKAHEAD_TENSORS: tuple[tuple[str, str, str], ...] = (
    ("lookahead_window_size", "LOOKAHEAD_WINDOW_SIZE", "OUT_LOOKAHEAD_WINDOW_SIZE"),
    ("lookahead_ngram_size", "LOOKAHEAD_NGRAM_SIZE", "OUT_LOOKAHEAD_NGRAM_SIZE"),
    ("lookahead_verification_set_size", "LOOKAHEAD_VERIFICATION_SET_SIZE", "OUT_LOOKAHEAD_VERIFICATION_SET_SIZE"),
)


@dataclass(frozen=True)
class RepositorySettings:
    """Everything the configs need, read from the plan by ``repository.settings_from_plan``."""

    ensemble_name: str
    max_batch_size: int
    decoupled: bool
    lookahead: bool  # route per-request (W, N, G)
    preprocessing_instances: int
    postprocessing_instances: int
    max_queue_delay_microseconds: int
    preprocessing_parameters: dict[str, str]
    postprocessing_parameters: dict[str, str]
    tensorrt_llm_parameters: dict[str, str]


def _python_model(name: str, settings: RepositorySettings, instances: int) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=settings.max_batch_size)
    config.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)
    # Requests queued while an instance is busy are handed over together (one Python call).
    config.dynamic_batching.SetInParent()
    return config


def preprocessing_config(settings: RepositorySettings) -> mc.ModelConfig:
    config = _python_model(PREPROCESSING, settings, settings.preprocessing_instances)
    config.input.extend([
        model_input("QUERY", "STRING", [1]),
        model_input("REQUEST_OUTPUT_LEN", "INT32", [1]),
        model_input("BAD_WORDS_DICT", "STRING", [-1], optional=True),
        model_input("STOP_WORDS_DICT", "STRING", [-1], optional=True),
        model_input("END_ID", "INT32", [1], optional=True),
        model_input("PAD_ID", "INT32", [1], optional=True),
    ])
    config.output.extend([
        model_output("INPUT_ID", "INT32", [-1]),
        model_output("REQUEST_INPUT_LEN", "INT32", [1]),
        model_output("BAD_WORDS_IDS", "INT32", [2, -1]),
        model_output("STOP_WORDS_IDS", "INT32", [2, -1]),
        model_output("REQUEST_OUTPUT_LEN", "INT32", [-1]),
        model_output("OUT_END_ID", "INT32", [1]),
        model_output("OUT_PAD_ID", "INT32", [1]),
    ])
    if settings.lookahead:
        for _, inner, out in LOOKAHEAD_TENSORS:
            config.input.append(model_input(inner, "INT32", [1], optional=True))
            config.output.append(model_output(out, "INT32", [1]))
    set_parameters(config, settings.preprocessing_parameters)
    return config


def postprocessing_config(settings: RepositorySettings) -> mc.ModelConfig:
    config = _python_model(POSTPROCESSING, settings, settings.postprocessing_instances)
    config.input.extend([
        model_input("TOKENS_BATCH", "INT32", [-1, -1]),
        model_input("SEQUENCE_LENGTH", "INT32", [-1]),
    ])
    config.output.extend([
        model_output("OUTPUT", "STRING", [-1]),
        # Tokens decoded into OUTPUT: a streamed step can carry several (accepted drafts).
        model_output("OUTPUT_TOKEN_COUNT", "INT32", [-1]),
    ])
    set_parameters(config, settings.postprocessing_parameters)
    return config


def tensorrt_llm_config(settings: RepositorySettings) -> mc.ModelConfig:
    size = settings.max_batch_size
    config = mc.ModelConfig(name=TENSORRT_LLM, backend="tensorrtllm", max_batch_size=size)
    config.model_transaction_policy.decoupled = settings.decoupled
    batching = config.dynamic_batching
    batching.preferred_batch_size.append(size)
    batching.max_queue_delay_microseconds = settings.max_queue_delay_microseconds
    batching.default_queue_policy.max_queue_size = 0  # unbounded; the backend reads it as maxQueueSize
    # One instance: the backend runs its own in-flight batcher across all requests (and all GPUs).
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.input.extend([
        model_input("input_ids", "INT32", [-1], ragged=True),
        model_input("input_lengths", "INT32", [1], scalar=True),
        model_input("request_output_len", "INT32", [1], scalar=True),
        model_input("end_id", "INT32", [1], scalar=True, optional=True),
        model_input("pad_id", "INT32", [1], scalar=True, optional=True),
        model_input("stop_words_list", "INT32", [2, -1], optional=True, ragged=True),
        model_input("bad_words_list", "INT32", [2, -1], optional=True, ragged=True),
        model_input("stop", "BOOL", [1], scalar=True, optional=True),
    ])
    for _, dtype, inner in SAMPLING_INPUTS:
        config.input.append(model_input(inner, dtype, [1], scalar=True, optional=True))
    if settings.lookahead:
        for inner, _, _ in LOOKAHEAD_TENSORS:
            config.input.append(model_input(inner, "INT32", [1], optional=True))
    config.output.extend([
        model_output("output_ids", "INT32", [-1, -1]),
        model_output("sequence_length", "INT32", [-1]),
    ])
    config.output.extend(model_output(name, dtype, dims) for name, dtype, dims in PASSTHROUGH_OUTPUTS)
    set_parameters(config, settings.tensorrt_llm_parameters)
    return config


def _step(ensemble: mc.ModelConfig, model: str, inputs: dict[str, str], outputs: dict[str, str]) -> None:
    step = ensemble.ensemble_scheduling.step.add(model_name=model, model_version=-1)
    step.input_map.update(inputs)  # model tensor -> ensemble tensor
    step.output_map.update(outputs)


def ensemble_config(settings: RepositorySettings) -> mc.ModelConfig:
    config = mc.ModelConfig(name=settings.ensemble_name, platform="ensemble", max_batch_size=settings.max_batch_size)
    config.input.extend([
        model_input("text_input", "STRING", [1]),
        model_input("max_tokens", "INT32", [1]),
        model_input("bad_words", "STRING", [-1], optional=True),
        model_input("stop_words", "STRING", [-1], optional=True),
        model_input("end_id", "INT32", [1], optional=True),
        model_input("pad_id", "INT32", [1], optional=True),
    ])
    config.input.extend(model_input(name, dtype, [1], optional=True) for name, dtype, _ in SAMPLING_INPUTS)
    config.output.extend([
        model_output("text_output", "STRING", [-1]),
        model_output("text_output_tokens", "INT32", [-1]),
    ])
    config.output.extend(model_output(name, dtype, dims) for name, dtype, dims in PASSTHROUGH_OUTPUTS)

    pre_in = {"QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens", "BAD_WORDS_DICT": "bad_words",
              "STOP_WORDS_DICT": "stop_words", "END_ID": "end_id", "PAD_ID": "pad_id"}
    pre_out = {"REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN", "INPUT_ID": "_INPUT_ID",
               "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN", "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
               "BAD_WORDS_IDS": "_BAD_WORDS_IDS", "OUT_END_ID": "_PREPROCESSOR_END_ID",
               "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID"}
    llm_in = {"input_ids": "_INPUT_ID", "input_lengths": "_REQUEST_INPUT_LEN",
              "request_output_len": "_REQUEST_OUTPUT_LEN", "end_id": "_PREPROCESSOR_END_ID",
              "pad_id": "_PREPROCESSOR_PAD_ID", "stop_words_list": "_STOP_WORDS_IDS",
              "bad_words_list": "_BAD_WORDS_IDS"}
    llm_in.update({inner: outer for outer, _, inner in SAMPLING_INPUTS})
    if settings.lookahead:
        for outer, inner, out in LOOKAHEAD_TENSORS:
            config.input.append(model_input(outer, "INT32", [1], optional=True))
            pre_in[inner] = outer
            pre_out[out] = f"_{out}"
            llm_in[outer] = f"_{out}"
    llm_out = {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH"}
    llm_out.update({name: name for name, _, _ in PASSTHROUGH_OUTPUTS})

    _step(config, PREPROCESSING, pre_in, pre_out)
    _step(config, TENSORRT_LLM, llm_in, llm_out)
    _step(config, POSTPROCESSING, {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
          {"OUTPUT": "text_output", "OUTPUT_TOKEN_COUNT": "text_output_tokens"})
    return config


def all_configs(settings: RepositorySettings) -> dict[str, mc.ModelConfig]:
    """Model directory name -> config (the ensemble's directory is named after the ensemble)."""
    return {
        settings.ensemble_name: ensemble_config(settings),
        PREPROCESSING: preprocessing_config(settings),
        TENSORRT_LLM: tensorrt_llm_config(settings),
        POSTPROCESSING: postprocessing_config(settings),
    }
