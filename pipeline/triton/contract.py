"""The Triton contract: every tensor NVIDIA's TensorRT-LLM 1.2 ``inflight_batcher_llm`` models declare.

Clients written for NVIDIA's repository (``end_to_end_grpc_client.py``,
``inflight_batcher_llm_client.py``, the tensorrtllm_backend README's examples) send and request
tensors by these names; Triton refuses any tensor a config does not declare, on CPU and on a GPU
alike. So the emitted configs declare at least these, with the same data type, dims, optional
flag and reshape, and :mod:`pipeline.triton.configs` builds them from this table (nothing else
lists a tensor). Source: NVIDIA/TensorRT-LLM
``triton_backend/all_models/inflight_batcher_llm/{ensemble,preprocessing,tensorrt_llm,postprocessing,
tensorrt_llm_bls}/config.pbtxt`` (BSD-3-Clause); the table is transcribed, not copied.

Data types that NVIDIA's templates leave to a template variable are named by it here
(:data:`VARIABLE_TYPES`); the repository settings choose them. ``dims`` exclude the batch
dimension (every model has ``max_batch_size`` > 0). ``reshape=()`` is ``reshape: { shape: [ ] }``:
sent as [batch, 1], seen by the model as [batch].

specdeploy's own additions (:data:`EXTENSIONS`) are extra tensors only; none changes a contract one.
One narrowing: a LoRA engine's models withhold :data:`CLIENT_ADAPTER_INPUTS` unless the spec lets
clients bring adapters of their own (``serving.lora_client_adapters``).

Checked tensor by tensor (name, data type, dims, optional, reshape, ragged) against NVIDIA/TensorRT-LLM
``tensorrt_llm/config.pbtxt`` at commit 0c8de69a1ca6213eebb20a51873890ff128666c2 and ``ensemble/config.pbtxt``
(inputs, outputs and the tensorrt_llm step's wiring) at 2a9abd9536aa62ad3e4b9314be9286b1b1be523b, the commit
``end_to_end_grpc_client.py`` in tests/data comes from; ``preprocessing/config.pbtxt`` at
08dc37e368e4718ae680bdb9be8da24ebd420a53, ``postprocessing/config.pbtxt`` at
89fd9b74ab7ae753b4c6b3db25a400dca7ea54a0 and ``tensorrt_llm_bls/config.pbtxt`` at
0193dbd4189221d0fd5e9f20cdb384d3da8dbc24. Which 1.2.1 is meant: triton-inference-server/tensorrtllm_backend
commit 8addf2f (pull request 853) builds its container from TensorRT-LLM's ``release/1.2.1`` branch, and its
``tensorrt_llm`` submodule pins commit 2fdb9e66 of the triton-inference-server/TensorRT-LLM fork; the commit
of NVIDIA's ``v1.2.1`` tag itself was not resolvable here (no copy of its history).
tests/triton/test_conformance.py sends every tensor of the table to a running server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.methods.lookahead import LOOKAHEAD_TRITON_KEYS

# Template variable -> the data type specdeploy emits for it.
VARIABLE_TYPES: dict[str, str] = {
    "${logits_datatype}": "FP32",  # the reference engines and SmolLM2's engines produce fp32 logits
    "${encoder_input_features_data_type}": "FP16",  # NVIDIA's default (BF16 for mllama only)
    "${prompt_embedding_table_data_type}": "FP16",  # NVIDIA's default
    # specdeploy's variable where NVIDIA's templates fix TYPE_FP16: TensorRT-LLM 1.2.1 takes LoRA
    # weights only in the engine's dtype (loraUtils.cpp: "Expected lora weights to be the same data
    # type as base model"), so a float32 engine's repository declares FP32 (settings_from_plan);
    # FP16 everywhere else, as NVIDIA's (a bfloat16 engine serves no adapters: pipeline/lora/rules.py).
    "${lora_weights_data_type}": "FP16",
}
LOGITS = "${logits_datatype}"
LORA_WEIGHTS = "${lora_weights_data_type}"


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str  # a pbtxt.DTYPES key, or a VARIABLE_TYPES key
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None
    ragged: bool = False  # allow_ragged_batch (inputs only)


def _in(
    name: str,
    dtype: str,
    dims: tuple[int, ...] = (1,),
    *,
    required: bool = False,
    scalar: bool = False,
    ragged: bool = False,
) -> Tensor:
    return Tensor(name, dtype, dims, optional=not required, reshape=() if scalar else None, ragged=ragged)


def _out(name: str, dtype: str, dims: tuple[int, ...] = (1,)) -> Tensor:
    return Tensor(name, dtype, dims)


def _scalars(dtype: str, *names: str) -> tuple[Tensor, ...]:
    return tuple(_in(name, dtype, scalar=True) for name in names)


# -- tensorrt_llm (backend "tensorrtllm") -------------------------------------------------------------

TENSORRT_LLM_INPUTS: tuple[Tensor, ...] = (
    _in("input_ids", "INT32", (-1,), ragged=True),
    _in("encoder_input_features", "${encoder_input_features_data_type}", (-1, -1), ragged=True),
    _in("encoder_output_lengths", "INT32", scalar=True),
    _in("input_lengths", "INT32", required=True, scalar=True),
    _in("request_output_len", "INT32", required=True, scalar=True),
    _in("num_return_sequences", "INT32", scalar=True),
    _in("draft_input_ids", "INT32", (-1,), ragged=True),
    _in("decoder_input_ids", "INT32", (-1,), ragged=True),
    _in("decoder_input_lengths", "INT32", scalar=True),
    _in("draft_logits", LOGITS, (-1, -1), ragged=True),
    _in("draft_acceptance_threshold", "FP32", scalar=True),
    _in("end_id", "INT32", scalar=True),
    _in("pad_id", "INT32", scalar=True),
    _in("stop_words_list", "INT32", (2, -1), ragged=True),
    _in("bad_words_list", "INT32", (2, -1), ragged=True),
    _in("embedding_bias", "FP32", (-1,), ragged=True),
    _in("beam_width", "INT32", scalar=True),
    _in("temperature", "FP32", scalar=True),
    _in("runtime_top_k", "INT32", scalar=True),
    *_scalars("FP32", "runtime_top_p", "runtime_top_p_min", "runtime_top_p_decay"),
    _in("runtime_top_p_reset_ids", "INT32", scalar=True),
    _in("len_penalty", "FP32", scalar=True),
    _in("early_stopping", "BOOL", scalar=True),
    _in("repetition_penalty", "FP32", scalar=True),
    _in("min_tokens", "INT32", scalar=True),
    *_scalars("FP32", "beam_search_diversity_rate", "presence_penalty", "frequency_penalty"),
    _in("seed", "UINT64", scalar=True),
    *_scalars(
        "BOOL",
        "return_log_probs",
        "return_context_logits",
        "return_generation_logits",
        "return_perf_metrics",
        "return_num_input_tokens",
        "return_num_output_tokens",
        "exclude_input_in_output",
        "stop",
        "streaming",
    ),
    _in("prompt_embedding_table", "${prompt_embedding_table_data_type}", (-1, -1), ragged=True),
    _in("prompt_table_extra_ids", "UINT64", (-1,), ragged=True),
    _in("prompt_vocab_size", "INT32", scalar=True),
    _in("cross_attention_mask", "BOOL", (-1, -1), ragged=True),
    _in("mrope_rotary_cos_sin", "FP32", (-1,)),
    _in("mrope_position_deltas", "INT64"),
    _in("lora_task_id", "UINT64", scalar=True),
    _in("lora_weights", LORA_WEIGHTS, (-1, -1), ragged=True),
    _in("lora_config", "INT32", (-1, 3), ragged=True),
    _in("context_phase_params", "UINT8", (-1,), ragged=True),
    _in("skip_cross_attn_blocks", "BOOL", ragged=True),
    *(
        _in(f"retention_token_range_{part}", "INT32", (-1,), ragged=True)
        for part in ("starts", "ends", "priorities", "durations_ms")
    ),
    _in("retention_decode_priority", "INT32", ragged=True),
    _in("retention_decode_duration_ms", "INT32", ragged=True),
    _in("guided_decoding_guide_type", "STRING", ragged=True),
    _in("guided_decoding_guide", "STRING", ragged=True),
    # Declared for every decoding mode; the backend refuses them unless the model is Lookahead.
    _in("lookahead_window_size", "INT32", ragged=True),
    _in("lookahead_ngram_size", "INT32", ragged=True),
    _in("lookahead_verification_set_size", "INT32", ragged=True),
)

# Outputs every generating model returns (tensorrt_llm, and after it the ensemble and the BLS model).
RESULT_OUTPUTS: tuple[Tensor, ...] = (
    _out("cum_log_probs", "FP32", (-1,)),
    _out("output_log_probs", "FP32", (-1, -1)),
    _out("context_logits", LOGITS, (-1, -1)),
    _out("generation_logits", LOGITS, (-1, -1, -1)),
    _out("batch_index", "INT32"),
    _out("sequence_index", "INT32"),
)
PERF_OUTPUTS: tuple[Tensor, ...] = (
    _out("kv_cache_alloc_new_blocks", "INT32"),
    _out("kv_cache_reused_blocks", "INT32"),
    _out("kv_cache_alloc_total_blocks", "INT32"),
    _out("arrival_time_ns", "INT64"),
    _out("first_scheduled_time_ns", "INT64"),
    _out("first_token_time_ns", "INT64"),
    _out("last_token_time_ns", "INT64"),
    _out("acceptance_rate", "FP32"),
    _out("total_accepted_draft_tokens", "INT32"),
    _out("total_draft_tokens", "INT32"),
    _out("num_input_tokens", "INT32"),
    _out("num_output_tokens", "INT32"),
)

TENSORRT_LLM_OUTPUTS: tuple[Tensor, ...] = (
    _out("output_ids", "INT32", (-1, -1)),
    _out("sequence_length", "INT32", (-1,)),
    *RESULT_OUTPUTS,
    _out("context_phase_params", "UINT8", (-1,)),
    *PERF_OUTPUTS,
)

# -- preprocessing / postprocessing (python) --------------------------------------------------------

PREPROCESSING_INPUTS: tuple[Tensor, ...] = (
    _in("QUERY", "STRING", required=True),
    _in("DECODER_QUERY", "STRING"),
    _in("IMAGE_BYTES", "UINT8", (-1, -1, -1, -1)),
    _in("IMAGE_URL", "STRING"),
    _in("IMAGES", "STRING", (-1,)),
    _in("VIDEO_BYTES", "UINT8", (-1, -1, -1, -1)),
    _in("REQUEST_OUTPUT_LEN", "INT32", required=True),
    _in("BAD_WORDS_DICT", "STRING", (-1,)),
    _in("STOP_WORDS_DICT", "STRING", (-1,)),
    _in("EMBEDDING_BIAS_WORDS", "STRING", (-1,)),
    _in("EMBEDDING_BIAS_WEIGHTS", "FP32", (-1,)),
    _in("END_ID", "INT32"),
    _in("PAD_ID", "INT32"),
    _in("PROMPT_TABLE_EXTRA_ID", "UINT64"),
)
PREPROCESSING_OUTPUTS: tuple[Tensor, ...] = (
    _out("INPUT_ID", "INT32", (-1,)),
    _out("REQUEST_INPUT_LEN", "INT32"),
    _out("DECODER_INPUT_ID", "INT32", (-1,)),
    _out("REQUEST_DECODER_INPUT_LEN", "INT32"),
    _out("BAD_WORDS_IDS", "INT32", (2, -1)),
    _out("STOP_WORDS_IDS", "INT32", (2, -1)),
    _out("EMBEDDING_BIAS", "FP32", (-1,)),
    _out("REQUEST_OUTPUT_LEN", "INT32", (-1,)),
    _out("OUT_END_ID", "INT32"),
    _out("OUT_PAD_ID", "INT32"),
    _out("OUT_PROMPT_TABLE_EXTRA_IDS", "UINT64", (-1,)),
    # Multimodal models only; declared so the config matches, never produced for a text model.
    _out("PIXEL_VALUES", "FP16", (-1, -1, -1, -1)),
    _out("ASPECT_RATIO_IDS", "INT64", (-1,)),
    _out("ASPECT_RATIO_MASK", "INT64", (-1, -1)),
    _out("CROSS_ATTENTION_MASK", "INT64", (-1, -1, -1)),
    _out("IMAGE_SIZES", "INT64", (-1, 2)),
    _out("IS_VIDEO_INPUT", "BOOL"),
    _out("ATTENTION_MASK", "INT64", (-1,)),
    _out("IMAGE_GRID_THW", "INT64", (3,)),
    _out("VISION_INPUT_ID", "INT32", (-1,)),
)

POSTPROCESSING_INPUTS: tuple[Tensor, ...] = (
    _in("TOKENS_BATCH", "INT32", (-1, -1), required=True),
    _in("SEQUENCE_LENGTH", "INT32", (-1,), required=True),
)
POSTPROCESSING_OUTPUTS: tuple[Tensor, ...] = (_out("OUTPUT", "STRING", (-1,)),)

# -- ensemble and tensorrt_llm_bls: the client-facing API -----------------------------------------------

_CLIENT_SAMPLING: tuple[Tensor, ...] = (
    _in("top_k", "INT32"),
    _in("top_p", "FP32"),
    _in("temperature", "FP32"),
    _in("length_penalty", "FP32"),
    _in("repetition_penalty", "FP32"),
    _in("min_tokens", "INT32"),
    _in("presence_penalty", "FP32"),
    _in("frequency_penalty", "FP32"),
    _in("seed", "UINT64"),
)

ENSEMBLE_INPUTS: tuple[Tensor, ...] = (
    _in("text_input", "STRING", required=True),
    _in("decoder_text_input", "STRING"),
    _in("max_tokens", "INT32", required=True),
    _in("num_return_sequences", "INT32"),
    _in("bad_words", "STRING", (-1,)),
    _in("stop_words", "STRING", (-1,)),
    _in("exclude_input_in_output", "BOOL"),
    _in("end_id", "INT32"),
    _in("pad_id", "INT32"),
    *_CLIENT_SAMPLING,
    *(
        _in(name, "BOOL")
        for name in (
            "return_log_probs",
            "return_context_logits",
            "return_generation_logits",
            "return_perf_metrics",
            "return_num_input_tokens",
            "return_num_output_tokens",
        )
    ),
    _in("beam_width", "INT32"),
    _in("stream", "BOOL"),
    _in("prompt_embedding_table", "FP16", (-1, -1)),
    _in("prompt_table_extra_id", "UINT64"),
    _in("prompt_vocab_size", "INT32"),
    _in("embedding_bias_words", "STRING", (-1,)),
    _in("embedding_bias_weights", "FP32", (-1,)),
    _in("lora_task_id", "UINT64"),
    _in("lora_weights", LORA_WEIGHTS, (-1, -1), ragged=True),
    _in("lora_config", "INT32", (-1, 3), ragged=True),
    _in("guided_decoding_guide_type", "STRING", ragged=True),
    _in("guided_decoding_guide", "STRING", ragged=True),
)
# NVIDIA's ensemble lists kv_cache_alloc_total_blocks twice; once is what it means.
ENSEMBLE_OUTPUTS: tuple[Tensor, ...] = (_out("text_output", "STRING", (-1,)), *RESULT_OUTPUTS, *PERF_OUTPUTS)

BLS_INPUTS: tuple[Tensor, ...] = (
    _in("text_input", "STRING", required=True),
    _in("decoder_text_input", "STRING"),
    _in("image_input", "FP16", (-1, 3, -1, -1)),
    _in("image_bytes_input", "UINT8", (-1, -1, -1, -1)),
    _in("image_url_input", "STRING"),
    _in("video_bytes_input", "UINT8", (-1, -1, -1, -1)),
    _in("max_tokens", "INT32", required=True),
    _in("bad_words", "STRING", (-1,)),
    _in("stop_words", "STRING", (-1,)),
    _in("exclude_input_in_output", "BOOL"),
    _in("end_id", "INT32"),
    _in("pad_id", "INT32"),
    *_CLIENT_SAMPLING,
    *_scalars("BOOL", "return_log_probs", "return_context_logits", "return_generation_logits"),
    _in("num_return_sequences", "INT32", scalar=True),
    _in("beam_width", "INT32"),
    _in("stream", "BOOL"),
    _in("prompt_embedding_table", "FP16", (-1, -1)),
    _in("prompt_vocab_size", "INT32"),
    _in("prompt_table_extra_id", "UINT64"),
    _in("embedding_bias_words", "STRING", (-1,)),
    _in("embedding_bias_weights", "FP32", (-1,)),
    _in("num_draft_tokens", "INT32"),
    _in("use_draft_logits", "BOOL", scalar=True),
    _in("lora_task_id", "UINT64", scalar=True),
    _in("lora_weights", LORA_WEIGHTS, (-1, -1), ragged=True),
    _in("lora_config", "INT32", (-1, 3), ragged=True),
    *_scalars("BOOL", "return_perf_metrics", "return_num_input_tokens", "return_num_output_tokens"),
    _in("guided_decoding_guide_type", "STRING"),
    _in("guided_decoding_guide", "STRING"),
)
BLS_OUTPUTS: tuple[Tensor, ...] = ENSEMBLE_OUTPUTS

# -- the ensemble's wiring: (model tensor -> ensemble tensor), per step, as NVIDIA's ensemble maps them ---

PREPROCESSING_STEP_INPUTS: dict[str, str] = {
    "QUERY": "text_input",
    "DECODER_QUERY": "decoder_text_input",
    "REQUEST_OUTPUT_LEN": "max_tokens",
    "BAD_WORDS_DICT": "bad_words",
    "STOP_WORDS_DICT": "stop_words",
    "EMBEDDING_BIAS_WORDS": "embedding_bias_words",
    "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights",
    "END_ID": "end_id",
    "PAD_ID": "pad_id",
    "PROMPT_TABLE_EXTRA_ID": "prompt_table_extra_id",
}
PREPROCESSING_STEP_OUTPUTS: dict[str, str] = {
    "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
    "INPUT_ID": "_INPUT_ID",
    "REQUEST_DECODER_INPUT_LEN": "_REQUEST_DECODER_INPUT_LEN",
    "DECODER_INPUT_ID": "_DECODER_INPUT_ID",
    "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
    "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
    "BAD_WORDS_IDS": "_BAD_WORDS_IDS",
    "EMBEDDING_BIAS": "_EMBEDDING_BIAS",
    "OUT_END_ID": "_PREPROCESSOR_END_ID",
    "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID",
    "OUT_PROMPT_TABLE_EXTRA_IDS": "_OUT_PROMPT_TABLE_EXTRA_IDS",
}
TENSORRT_LLM_STEP_INPUTS: dict[str, str] = {
    "input_ids": "_INPUT_ID",
    "decoder_input_ids": "_DECODER_INPUT_ID",
    "input_lengths": "_REQUEST_INPUT_LEN",
    "decoder_input_lengths": "_REQUEST_DECODER_INPUT_LEN",
    "exclude_input_in_output": "exclude_input_in_output",
    "request_output_len": "_REQUEST_OUTPUT_LEN",
    "end_id": "_PREPROCESSOR_END_ID",
    "pad_id": "_PREPROCESSOR_PAD_ID",
    "embedding_bias": "_EMBEDDING_BIAS",
    "runtime_top_k": "top_k",
    "runtime_top_p": "top_p",
    "temperature": "temperature",
    "len_penalty": "length_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "return_log_probs": "return_log_probs",
    "return_context_logits": "return_context_logits",
    "return_generation_logits": "return_generation_logits",
    "return_perf_metrics": "return_perf_metrics",
    "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens",
    "num_return_sequences": "num_return_sequences",
    "beam_width": "beam_width",
    "streaming": "stream",
    "prompt_embedding_table": "prompt_embedding_table",
    "prompt_vocab_size": "prompt_vocab_size",
    "stop_words_list": "_STOP_WORDS_IDS",
    "bad_words_list": "_BAD_WORDS_IDS",
    "prompt_table_extra_ids": "_OUT_PROMPT_TABLE_EXTRA_IDS",
    "lora_task_id": "lora_task_id",
    "lora_weights": "lora_weights",
    "lora_config": "lora_config",
    "guided_decoding_guide_type": "guided_decoding_guide_type",
    "guided_decoding_guide": "guided_decoding_guide",
}
TENSORRT_LLM_STEP_OUTPUTS: dict[str, str] = {
    "output_ids": "_TOKENS_BATCH",
    "sequence_length": "_SEQUENCE_LENGTH",
    **{t.name: t.name for t in RESULT_OUTPUTS + PERF_OUTPUTS},
}
POSTPROCESSING_STEP_INPUTS: dict[str, str] = {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"}
POSTPROCESSING_STEP_OUTPUTS: dict[str, str] = {"OUTPUT": "text_output"}

# -- specdeploy's additions ----------------------------------------------------------------------------

LOOKAHEAD_CLIENT_INPUTS = LOOKAHEAD_TRITON_KEYS


@dataclass(frozen=True)
class Extension:
    """Extra tensors of one model, and why they exist."""

    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[Tensor, ...] = ()
    lookahead_only: bool = False
    lora_only: bool = False  # a shared LoRA fine-tune's models (pipeline.lora.group)


EXTENSIONS: dict[str, tuple[Extension, ...]] = {
    # The number of tokens behind each text piece: a speculative step can accept several tokens,
    # so a client cannot count tokens by counting responses.
    "postprocessing": (Extension(outputs=(_out("OUTPUT_TOKEN_COUNT", "INT32", (-1,)),)),),
    "ensemble": (
        Extension(outputs=(_out("text_output_tokens", "INT32", (-1,)),)),
        # Lookahead: a request's (W, N, G) go through preprocessing, which fills the server's
        # values for missing ones (tensorrtllm_backend#711) and bounds them.
        Extension(inputs=tuple(_in(name, "INT32") for name in LOOKAHEAD_CLIENT_INPUTS), lookahead_only=True),
    ),
    "preprocessing": (
        Extension(
            inputs=tuple(_in(name.upper(), "INT32") for name in LOOKAHEAD_CLIENT_INPUTS),
            outputs=tuple(_out(f"OUT_{name.upper()}", "INT32") for name in LOOKAHEAD_CLIENT_INPUTS),
            lookahead_only=True,
        ),
        # A shared LoRA fine-tune's own model name behind Triton's ensemble (serving.ensemble: triton),
        # which cannot add a constant: its preprocessing sets the request's lora_task_id (the fine-tune's,
        # unless the client sent one) for the group's tensorrt_llm model.
        Extension(
            inputs=(_in("LORA_TASK_ID", "UINT64"),), outputs=(_out("OUT_LORA_TASK_ID", "UINT64"),), lora_only=True
        ),
    ),
    "tensorrt_llm_bls": (Extension(outputs=(_out("text_output_tokens", "INT32", (-1,)),)),),
}

CONTRACT: dict[str, tuple[tuple[Tensor, ...], tuple[Tensor, ...]]] = {
    "ensemble": (ENSEMBLE_INPUTS, ENSEMBLE_OUTPUTS),
    "preprocessing": (PREPROCESSING_INPUTS, PREPROCESSING_OUTPUTS),
    "tensorrt_llm": (TENSORRT_LLM_INPUTS, TENSORRT_LLM_OUTPUTS),
    "postprocessing": (POSTPROCESSING_INPUTS, POSTPROCESSING_OUTPUTS),
    "tensorrt_llm_bls": (BLS_INPUTS, BLS_OUTPUTS),
}


def extensions(model: str, lookahead: bool, lora: bool = False) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """The extra (inputs, outputs) specdeploy declares on ``model`` (the contract's key)."""
    chosen = [e for e in EXTENSIONS.get(model, ()) if (lookahead or not e.lookahead_only) and (lora or not e.lora_only)]
    return (tuple(t for e in chosen for t in e.inputs), tuple(t for e in chosen for t in e.outputs))


# A client's own adapter: withheld from a LoRA engine's models unless serving.lora_client_adapters is on.
# With them any client can load adapters into the engine's LoRA cache, whose least recently used
# entries TensorRT-LLM 1.2.1 evicts, the adapters lora_prefetch_dir loaded included (loraCache.cpp):
# the deployed fine-tunes would then fail "LoRA task N not found in cache". Without them Triton
# itself refuses such a request ("unexpected inference input"), before any backend, GPU or CPU, sees it.
CLIENT_ADAPTER_INPUTS = frozenset({"lora_weights", "lora_config"})


def declared(
    model: str, lookahead: bool, lora: bool = False, client_adapters: bool = True
) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """The (inputs, outputs) ``model`` (the contract's key) declares: NVIDIA's, then specdeploy's
    extensions, less :data:`CLIENT_ADAPTER_INPUTS` where clients may not bring adapters."""
    inputs, outputs = CONTRACT[model]
    extra_inputs, extra_outputs = extensions(model, lookahead, lora)
    kept = tuple(t for t in inputs + extra_inputs if client_adapters or t.name not in CLIENT_ADAPTER_INPUTS)
    return kept, outputs + extra_outputs


def data_type(tensor: Tensor, variables: Mapping[str, str] | None = None) -> str:
    """The concrete data type: template variables resolved to ``variables`` (a repository's
    settings), else to specdeploy's defaults."""
    return {**VARIABLE_TYPES, **(variables or {})}.get(tensor.data_type, tensor.data_type)
