"""The ``tensorrt_llm`` model's contract, as pure functions (no Triton import, unit-testable).

* :func:`parse_parameters`: the model config's ``parameters`` -> :class:`BackendParams`;
  every TensorRT-LLM key is accepted, unknown ones ignored, leftover ``${x}`` means unset
  (what the C++ backend does).
* :func:`parse_parts`: a request's sequences (batch rows x ``num_return_sequences``), each a
  :class:`Part` whose responses carry ``batch_index`` / ``sequence_index``, as TensorRT-LLM
  splits them (with beam search a row is one sequence whose response carries the best
  ``num_return_sequences`` beams); :func:`parse_request` parses one sequence's tensors.
* :func:`parse_request`: one sequence's input tensors -> :class:`GenerationRequest`, or a
  :class:`StopRequest` (the ``stop`` input cancels the in-flight request with the same id).
* :func:`response_arrays`: a :class:`StepOutput` -> output arrays shaped as the config declares
  them with the leading batch dim of 1 (``max_batch_size`` > 0): ``output_ids`` [1, beams, len]
  (shorter beams padded with the end id), ``sequence_length`` / ``cum_log_probs`` [1, beams],
  ``output_log_probs`` [1, beams, len], ``generation_logits`` [1, beams, len, vocab] (shorter beams padded
  with zeros), ``context_logits`` [1, prompt, vocab] (in every response, streaming ones too), perf metrics
  [1, 1].
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import methods
from pipeline.errors import InputError
from pipeline.lora.rules import REQUEST_CHECKS
from pipeline.methods.lookahead import LOOKAHEAD_TRITON_KEYS, LookaheadConfig
from pipeline.runtime.request import GenerationRequest, LoraRequest, SamplingParams, StepOutput, parse_words_list
from pipeline.runtime.spec_decode import registry
from pipeline.runtime.spec_decode.factory import MethodSettings, load_runtimes
from pipeline.runtime.spec_decode.parameters import TritonParameters

# What a method's parameters hook may set besides {its name: its settings}.
SETTINGS_FIELDS = frozenset(f.name for f in fields(MethodSettings)) - {"decoding_mode", "own"}

GetInput = Callable[[str], "np.ndarray | None"]  # input tensor by name, None when not sent


@dataclass(frozen=True)
class BackendParams:
    engine_dir: Path
    max_beam_width: int = 1
    exclude_input_in_output: bool = False
    cancellation_check_period_ms: int = 100
    # decoding_mode and each method's own keys (its runtime module reads them): what selects and shapes it
    method: MethodSettings = MethodSettings()
    num_threads: int | None = None  # our own key: torch threads (default: the CPUs we may use)
    decoupled: bool = True
    # The LoRA cache (TensorRT-LLM's PeftCacheConfig): adapters loaded at startup from
    # <lora_prefetch_dir>/<task id>/, and the host cache's size (the reference engine keeps its
    # adapters in host memory; lora_cache_gpu_memory_fraction has nothing to size here).
    lora_prefetch_dir: Path | None = None
    lora_cache_host_memory_bytes: int | None = None
    lora_client_adapters: bool = True  # our own key (reference_lora_client_adapters): TensorRT-LLM has none
    outputs: frozenset[str] = field(default_factory=frozenset)  # outputs the config declares
    warnings: tuple[str, ...] = ()


def _prefetch_dir(values: Mapping[str, str], model_dir: Path | None) -> Path | None:
    """``lora_prefetch_dir`` names the adapters where a deployment mounts them; off that mount, they are
    where the package stage left them relative to this model's folder (``reference_lora_prefetch_path``)."""
    if "lora_prefetch_dir" not in values:
        return None
    deployed = Path(values["lora_prefetch_dir"])
    packaged = values.get("reference_lora_prefetch_path")
    if packaged and model_dir is not None and not deployed.is_dir():
        return model_dir / packaged
    return deployed


def parse_parameters(model_config: dict[str, Any], model_dir: Path | None = None) -> BackendParams:
    read = TritonParameters.of(model_config)
    values = read.values
    if "gpt_model_path" not in values:
        raise InputError("tensorrt_llm model config: parameter gpt_model_path (the engine folder) is not set")
    engine_dir = Path(values["gpt_model_path"])
    if not engine_dir.is_absolute() and model_dir is not None:
        engine_dir = model_dir / engine_dir
    packaged = values.get("reference_engine_path")
    if packaged and model_dir is not None and not (engine_dir / "config.json").is_file():
        # gpt_model_path names the engine where a deployment mounts it; off that mount, the engine
        # is where the package stage left it relative to this model's folder.
        engine_dir = model_dir / packaged
    load_runtimes()
    settings: dict[str, Any] = {}
    by_method: dict[str, Any] = {}  # MethodSettings.own
    for definition in methods.definitions():  # each method reads its own keys, in a fixed order
        runtime = registry.RUNTIMES.get(definition.name)
        if runtime is not None and runtime.parameters is not None:
            own = dict(runtime.parameters(read))
            if definition.name in own and definition.name not in SETTINGS_FIELDS:  # a method without a field
                by_method[definition.name] = own.pop(definition.name)
            assert own.keys() <= SETTINGS_FIELDS, f"{definition.name} sets {own.keys() - SETTINGS_FIELDS}"
            assert not own.keys() & settings.keys(), (
                f"{definition.name} sets another method's {own.keys() & settings.keys()}"
            )
            settings |= own
    policy = model_config.get("model_transaction_policy") or {}
    return BackendParams(
        engine_dir=engine_dir,
        max_beam_width=read.integer("max_beam_width", 1) or 1,
        exclude_input_in_output=read.boolean("exclude_input_in_output", False),
        cancellation_check_period_ms=read.integer("cancellation_check_period_ms", 100) or 100,
        method=MethodSettings(decoding_mode=values.get("decoding_mode"), own=by_method, **settings),
        num_threads=read.integer("reference_num_threads", None),
        decoupled=bool(policy.get("decoupled", False)),
        lora_prefetch_dir=_prefetch_dir(values, model_dir),
        lora_cache_host_memory_bytes=read.integer("lora_cache_host_memory_bytes", None),
        lora_client_adapters=read.boolean("reference_lora_client_adapters", True),
        outputs=frozenset(o["name"] for o in model_config.get("output") or []),
        warnings=tuple(read.warnings),
    )


@dataclass(frozen=True)
class StopRequest:
    """``stop=true``: cancel the in-flight request(s) with this id."""

    request_id: str


def _scalar(get: GetInput, name: str, default: Any) -> Any:
    value = get(name)
    if value is None or value.size == 0:
        return default
    return value.reshape(-1)[0].item()


# Inputs whose non-default values change what TensorRT-LLM generates; the reference backend
# refuses them rather than answer differently from the GPU.
# (len_penalty only changes beam search: with beam width 1 it has no effect, on the GPU too.)
# What TensorRT-LLM's executor refuses outright (SamplingConfig's checks), whatever the backend.
_IN_RANGE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "beam_width": (lambda v: v >= 1, ">= 1"),
    "num_return_sequences": (lambda v: v >= 1, ">= 1"),
    "min_tokens": (lambda v: v >= 0, ">= 0"),
    "repetition_penalty": (lambda v: v > 0, "> 0"),
    "len_penalty": (lambda v: v >= 0, ">= 0"),
}
_UNSUPPORTED_TENSORS = (
    "draft_input_ids",
    "prompt_embedding_table",
    "encoder_input_features",
    "guided_decoding_guide",
)


def parse_request(get: GetInput, request_id: str, params: BackendParams) -> GenerationRequest | StopRequest:
    """Raises InputError with a one-line message for a request this backend cannot serve."""
    if _scalar(get, "stop", False):
        return StopRequest(request_id)
    ids = get("input_ids")
    if ids is None:
        raise InputError("input input_ids is missing")
    if ids.ndim == 2 and ids.shape[0] != 1:
        raise InputError(f"batch size {ids.shape[0]}: parse_parts splits a request into its sequences first")
    ids = ids.reshape(-1)
    length = int(_scalar(get, "input_lengths", ids.size))
    if not 0 <= length <= ids.size:
        raise InputError(f"input_lengths {length} does not fit the {ids.size} input_ids")
    output_len = _scalar(get, "request_output_len", None)
    if output_len is None:
        raise InputError("input request_output_len is missing")
    for name, (legal, allowed) in _IN_RANGE.items():
        value = _scalar(get, name, None)
        if value is not None and not legal(value):  # NaN is never legal
            raise InputError(
                f"{name}={value:g} is out of range: must be {allowed}, as TensorRT-LLM's executor requires"
            )
    for name in _UNSUPPORTED_TENSORS:
        value = get(name)
        if value is not None and value.size:
            raise InputError(f"input {name} is not supported by the reference backend")
    bad = get("bad_words_list")
    bad_words = parse_words_list(bad.reshape(2, -1), "bad_words_list") if bad is not None and bad.size else ()
    bias = get("embedding_bias")
    embedding_bias = tuple(float(b) for b in bias.reshape(-1)) if bias is not None and np.any(bias != 0) else ()
    stop_words = get("stop_words_list")
    lookahead = _lookahead_inputs(get, params)
    lora = _lora_inputs(get)
    streaming = bool(_scalar(get, "streaming", False))
    if streaming and not params.decoupled:
        raise InputError("Streaming is only supported if model is deployed using decoupled mode.")
    end_id = _scalar(get, "end_id", None)
    pad_id = _scalar(get, "pad_id", None)
    return GenerationRequest(
        request_id=request_id,
        input_ids=tuple(int(t) for t in ids[:length]),
        max_new_tokens=int(output_len),
        end_id=None if end_id is None else int(end_id),
        pad_id=None if pad_id is None else int(pad_id),
        stop_words=parse_words_list(stop_words.reshape(2, -1)) if stop_words is not None and stop_words.size else (),
        sampling=SamplingParams(
            temperature=float(_scalar(get, "temperature", 1.0)),
            top_k=int(_scalar(get, "runtime_top_k", 0)),
            top_p=float(_scalar(get, "runtime_top_p", 0.0)),
            seed=int(_scalar(get, "seed", 0)),
            repetition_penalty=float(_scalar(get, "repetition_penalty", 1.0)),
            presence_penalty=float(_scalar(get, "presence_penalty", 0.0)),
            frequency_penalty=float(_scalar(get, "frequency_penalty", 0.0)),
            min_tokens=int(_scalar(get, "min_tokens", 1)),
            bad_words=bad_words,
            embedding_bias=embedding_bias,
            beam_width=int(_scalar(get, "beam_width", 1) or 1),
            length_penalty=float(_scalar(get, "len_penalty", 0.0)),
            early_stopping=int(_scalar(get, "early_stopping", 1)),
            beam_search_diversity_rate=float(_scalar(get, "beam_search_diversity_rate", 0.0)),
        ),
        return_log_probs=bool(_scalar(get, "return_log_probs", False)),
        return_generation_logits=bool(_scalar(get, "return_generation_logits", False)),
        return_context_logits=bool(_scalar(get, "return_context_logits", False)),
        streaming=streaming,
        exclude_input_in_output=bool(_scalar(get, "exclude_input_in_output", params.exclude_input_in_output)),
        return_perf_metrics=bool(_scalar(get, "return_perf_metrics", False)),
        lookahead=lookahead,
        lora=lora,
    )


def _lora_inputs(get: GetInput) -> LoraRequest | None:
    """lora_task_id (UINT64), and with a task's first request lora_weights [1, rows, width] (in the
    dtype the repository declares: the engine's, FP16 for a bfloat16 one, widened here) and
    lora_config [1, rows, 3] int32; TensorRT-LLM's own checks follow in the scheduler."""
    task = get("lora_task_id")
    weights, config = get("lora_weights"), get("lora_config")
    has_weights = weights is not None and weights.size > 0
    has_config = config is not None and config.size > 0
    if task is None or task.size == 0:
        if has_weights or has_config:
            raise InputError(f"lora_weights/lora_config without lora_task_id: {REQUEST_CHECKS['no_task_id']}")
        return None
    if not (has_weights or has_config):
        return LoraRequest(int(task.reshape(-1)[0]))
    if not (has_weights and has_config):
        raise InputError(REQUEST_CHECKS["pair"])
    assert weights is not None and config is not None
    return LoraRequest(int(task.reshape(-1)[0]), _batch_of_one(weights), _batch_of_one(config))


def _batch_of_one(value: np.ndarray) -> np.ndarray:
    return value if value.ndim == 3 else value.reshape(1, *value.shape[-2:])


@dataclass(frozen=True)
class Part:
    """One sequence of a Triton request: TensorRT-LLM serves a request of batch size B with
    num_return_sequences N as B x N sequences, each response tagged with its indices."""

    request: GenerationRequest
    batch_index: int = 0
    sequence_index: int = 0


def parse_parts(
    get: GetInput, request_id: str, params: BackendParams, max_sequences: int | None = None
) -> list[Part] | StopRequest:
    """The request's sequences (rows x num_return_sequences); InputError for one it cannot serve.

    ``max_sequences`` (the engine's max_batch_size): without beam search each returned sequence is a
    request of the in-flight batch, and TensorRT-LLM would queue the ones beyond it behind each other,
    holding the server for all of them; more than the engine can run at once is refused."""
    if _scalar(get, "stop", False):
        return StopRequest(request_id)
    ids = get("input_ids")
    rows = ids.shape[0] if ids is not None and ids.ndim == 2 else 1
    if rows > 1 and not params.decoupled:  # TensorRT-LLM's own rule (inflight_batcher_llm/src/utils.cc)
        raise InputError("Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy")
    parts: list[Part] = []
    for row in range(rows):
        row_get = _row_getter(get, row, rows)
        request = parse_request(row_get, request_id, params)
        assert isinstance(request, GenerationRequest)
        sent = _scalar(row_get, "num_return_sequences", None)
        count = int(sent or 1)
        if count < 1:
            raise InputError(f"num_return_sequences must be at least 1, got {count}")
        if request.sampling.beam_width > 1:
            # Beam search: one sequence whose response carries the best num_return_sequences beams
            # (executor SamplingConfig::getNumReturnBeams; the scheduler refuses more than beam_width).
            beams = replace(request, num_return_beams=None if sent is None else count)
            parts.append(Part(beams, row, 0))
            continue
        if count > 1 and not params.decoupled:
            raise InputError(
                "num_return_sequences > 1 needs the decoupled transaction policy: each sequence is its own response"
            )
        if max_sequences is not None and rows * count > max_sequences:
            raise InputError(
                f"num_return_sequences={count} asks for {rows * count} sequences at once, more than the engine's "
                f"max_batch_size {max_sequences}; ask for at most {max(max_sequences // rows, 1)}"
            )
        # Sequence i samples from seed + i: the sequences differ unless decoding is greedy.
        parts.extend(
            Part(
                request
                if i == 0
                else replace(request, sampling=replace(request.sampling, seed=request.sampling.seed + i)),
                row,
                i,
            )
            for i in range(count)
        )
    return parts


def _row_getter(get: GetInput, row: int, rows: int) -> GetInput:
    """Inputs of one row: Triton delivers every input with the batch dimension first."""
    if rows == 1:
        return get

    def row_get(name: str) -> np.ndarray | None:
        value = get(name)
        if value is None or value.ndim == 0 or value.shape[0] != rows:
            return value
        return value[row : row + 1]

    return row_get


def _lookahead_inputs(get: GetInput, params: BackendParams) -> LookaheadConfig | None:
    """Per-request (w, n, g). Whether they fit the server's (W, N, G) is the Lookahead method's
    check (LookaheadDecoding.problem), answered as this request's error."""
    values = [_scalar(get, name, None) for name in LOOKAHEAD_TRITON_KEYS]
    if all(v is None for v in values):
        return None
    if params.method.lookahead is None:
        raise InputError(
            "lookahead_window_size / lookahead_ngram_size / lookahead_verification_set_size are only "
            "allowed when the model sets the lookahead parameters (decoding_mode lookahead)"
        )
    if any(v is None for v in values):
        raise InputError(
            "send all three of lookahead_window_size, lookahead_ngram_size and lookahead_verification_set_size, or none"
        )
    return LookaheadConfig(int(values[0]), int(values[1]), int(values[2]))


def response_arrays(
    out: StepOutput,
    request: GenerationRequest,
    declared: frozenset[str],
    num_input_tokens: bool = False,
    num_output_tokens: bool = False,
    part: Part | None = None,
) -> dict[str, np.ndarray]:
    """Output tensors of one response, restricted to the outputs the model config declares."""
    n = len(out.tokens)
    arrays: dict[str, np.ndarray] = {
        "output_ids": np.array(out.tokens, dtype=np.int32).reshape(1, 1, n),
        "sequence_length": np.array([[n]], dtype=np.int32),
        **(_beam_arrays(out, request) if out.beams is not None else {}),
        "batch_index": np.array([[part.batch_index if part else 0]], dtype=np.int32),
        "sequence_index": np.array([[part.sequence_index if part else 0]], dtype=np.int32),
    }
    if request.return_log_probs and out.beams is None:  # [1, beam, tokens] and [1, beam], generated tokens only
        arrays["output_log_probs"] = np.array(out.log_probs, dtype=np.float32).reshape(1, 1, -1)
        arrays["cum_log_probs"] = np.array([[out.cum_log_prob]], dtype=np.float32)
    if request.return_generation_logits and out.beams is None:  # [1, beam, tokens, vocab]
        rows = np.stack(out.generation_logits) if out.generation_logits else np.zeros((0, 0), np.float32)
        arrays["generation_logits"] = rows.astype(np.float32).reshape(1, 1, *rows.shape)
    if out.context_logits is not None:  # [1, prompt, vocab]
        arrays["context_logits"] = out.context_logits.astype(np.float32)[None]
    if request.return_perf_metrics:
        m = out.metrics
        arrays.update(
            {
                # acceptance_rate = total_accepted_draft_tokens / total_draft_tokens (RequestMetrics).
                "acceptance_rate": np.array([[m.acceptance_rate]], dtype=np.float32),
                "total_accepted_draft_tokens": np.array([[m.total_accepted_draft_tokens]], dtype=np.int32),
                "total_draft_tokens": np.array([[m.total_draft_tokens]], dtype=np.int32),
                "kv_cache_alloc_new_blocks": np.array([[m.kv_cache_alloc_new_blocks]], dtype=np.int32),
                "kv_cache_reused_blocks": np.array([[m.kv_cache_reused_blocks]], dtype=np.int32),
                "kv_cache_alloc_total_blocks": np.array(
                    [[m.kv_cache_alloc_new_blocks + m.kv_cache_reused_blocks]], dtype=np.int32
                ),
                "arrival_time_ns": np.array([[m.arrival_time_ns]], dtype=np.int64),
                "first_scheduled_time_ns": np.array([[m.first_scheduled_time_ns]], dtype=np.int64),
                "first_token_time_ns": np.array([[m.first_token_time_ns]], dtype=np.int64),
                "last_token_time_ns": np.array([[m.last_token_time_ns]], dtype=np.int64),
            }
        )
    if num_input_tokens:
        arrays["num_input_tokens"] = np.array([[len(request.input_ids)]], dtype=np.int32)
    if num_output_tokens:
        with_prompt = not request.streaming and not request.exclude_input_in_output
        generated = n - len(request.input_ids) if with_prompt else n
        if out.beams:
            generated = len(out.beams[0].tokens)
        arrays["num_output_tokens"] = np.array([[generated]], dtype=np.int32)
    return {name: value for name, value in arrays.items() if not declared or name in declared}


def _beam_arrays(out: StepOutput, request: GenerationRequest) -> dict[str, np.ndarray]:
    """A beam-search response: every beam (prompt first unless excluded or streaming), padded to the
    longest with the end id, and per-beam lengths and log-probabilities."""
    beams = out.beams or []
    prompt = [] if request.streaming or request.exclude_input_in_output else list(request.input_ids)
    rows = [[*prompt, *beam.tokens] for beam in beams]
    width = max((len(row) for row in rows), default=0)
    pad = request.end_id if request.end_id is not None else 0
    ids = np.full((1, len(rows), width), pad, dtype=np.int32)
    for b, row in enumerate(rows):
        ids[0, b, : len(row)] = row
    arrays: dict[str, np.ndarray] = {
        "output_ids": ids,
        "sequence_length": np.array([[len(row) for row in rows]], dtype=np.int32),
    }
    if request.return_log_probs:
        longest = max((len(beam.log_probs) for beam in beams), default=0)
        log_probs = np.zeros((1, len(beams), longest), dtype=np.float32)
        for b, beam in enumerate(beams):
            log_probs[0, b, : len(beam.log_probs)] = beam.log_probs
        arrays["output_log_probs"] = log_probs
        arrays["cum_log_probs"] = np.array([[beam.cum_log_prob for beam in beams]], dtype=np.float32)
    if request.return_generation_logits:  # [1, beams, longest, vocab], each beam's rows along its history
        longest = max((len(beam.generation_logits) for beam in beams), default=0)
        vocab = next((len(beam.generation_logits[0]) for beam in beams if beam.generation_logits), 0)
        logits = np.zeros((1, len(beams), longest, vocab), dtype=np.float32)
        for b, beam in enumerate(beams):
            if beam.generation_logits:
                logits[0, b, : len(beam.generation_logits)] = np.stack(beam.generation_logits)
        arrays["generation_logits"] = logits
    return arrays
