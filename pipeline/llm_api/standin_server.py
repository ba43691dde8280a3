"""The CPU stand-in for ``trtllm-serve``: its OpenAI-compatible HTTP API over
:mod:`pipeline.llm_api.standin_runtime`, so a client written for the GPU deployment runs against this
host unchanged (``specdeploy serve`` of a ``target: pytorch`` spec where ``trtllm-serve`` is absent).

Routes, as ``tensorrt_llm/serve/openai_server.py`` names them (pipeline/targets/pytorch_sources.json):
``GET /health``, ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``, and
``GET /metrics``. With ``stream: true`` the two generation routes answer Server-Sent Events as OpenAI's
API does (``data: {chunk}`` per verification step the scheduler accepts, ``stream_options.include_usage``
adding a usage chunk, then ``data: [DONE]``); a client that disconnects cancels its request.

A fine-tune is chosen as on the GPU, by the body's ``lora_request`` (``lora_name`` or ``lora_int_id``
of a deployed fine-tune; an adapter path of the client's own is refused, as
``serving.lora_client_adapters`` is off), or, beyond trtllm-serve, by its own name in ``model``
(trtllm-serve never checks ``model``; here an unknown name is a 404). ``/metrics`` is the stand-in's
own JSON (trtllm-serve's is iteration statistics): per model name, the requests, tokens, and the draft
tokens proposed and accepted, with the acceptance length.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from pipeline.llm_api.standin_runtime import StandinRuntime
from pipeline.runtime.request import FinishReason, GenerationRequest, SamplingParams, StepOutput

# OpenAI's completion API default for max_tokens (chat has none: up to the model's length).
COMPLETION_MAX_TOKENS = 16


class LoraSelection(BaseModel):
    """The body's ``lora_request`` (TensorRT-LLM's ``LoRARequest``: lora_name, lora_int_id, lora_path)."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: Literal["hf", "nemo"] = "hf"


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields a server may not use
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    lora_request: LoraSelection | None = None


class CompletionBody(_Common):
    prompt: str | list[str]


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)


def _error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=status)


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def make_app(runtime: StandinRuntime) -> FastAPI:
    """The OpenAI-compatible app over ``runtime``."""
    app = FastAPI(title="specdeploy stand-in for trtllm-serve", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"] if p != "body")
        return _error(400, f"{where}: {first['msg']}" if where else str(first["msg"]))

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, str(exc), code=exc.code)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "specdeploy"} for name in runtime.adapters
        ]
        return {"object": "list", "data": data}

    @app.get("/metrics")
    async def metrics() -> dict[str, Any]:
        return {"method": runtime.method, "models": {name: s.to_dict() for name, s in runtime.stats.items()}}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionBody) -> dict[str, Any] | StreamingResponse:
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if len(prompts) != 1:
            raise ApiError(400, "prompt: one prompt per request")
        ids = runtime.tokenizer.encode(prompts[0])
        limit = body.max_tokens or COMPLETION_MAX_TOKENS
        if body.stream:
            return await _stream(runtime, body, ids, limit, "text_completion", created)
        text, reason, usage, model = await _generate(runtime, body, ids, limit)
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
        return _answer("text_completion", runtime, model, choice, usage, created)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatBody) -> dict[str, Any] | StreamingResponse:
        messages = [m.model_dump() for m in body.messages]
        ids = runtime.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = list(ids["input_ids"])
        limit = body.max_tokens or runtime.variant.build.max_seq_len - len(ids)
        if body.stream:
            return await _stream(runtime, body, ids, limit, "chat.completion.chunk", created)
        text, reason, usage, model = await _generate(runtime, body, ids, limit)
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
        return _answer("chat.completion", runtime, model, choice, usage, created)

    return app


def _served_model(runtime: StandinRuntime, body: _Common) -> str:
    """The served name a request runs on: its lora_request's fine-tune, else ``model`` by name."""
    if body.lora_request is not None:
        chosen = body.lora_request
        for name, task in runtime.adapters.items():
            if task is not None and (task == chosen.lora_int_id or name == chosen.lora_name):
                if task != chosen.lora_int_id or name != chosen.lora_name:
                    raise ApiError(
                        400, f"lora_request: {chosen.lora_name} is lora_int_id {task}, not {chosen.lora_int_id}"
                    )
                return name
        raise ApiError(
            400,
            f"lora_request: {chosen.lora_name} ({chosen.lora_int_id}) is not a deployed fine-tune "
            f"({', '.join(n for n, t in runtime.adapters.items() if t is not None) or 'none'}); "
            "adapters of the client's own are off (serving.lora_client_adapters)",
        )
    if body.model not in runtime.adapters:
        raise ApiError(404, f"The model `{body.model}` does not exist.", code="model_not_found")
    return body.model


def _prepare(runtime: StandinRuntime, body: _Common, ids: list[int], max_tokens: int) -> tuple[str, GenerationRequest]:
    """The served model name and the scheduler's request for ``body`` (ApiError: the client's fault)."""
    if body.stream_options is not None and not body.stream:
        raise ApiError(400, "stream_options: only allowed when stream is true")
    model = _served_model(runtime, body)
    tokenizer = runtime.tokenizer
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or ())
    # OpenAI: temperature 0 is greedy, else sampling from the top_p nucleus (1: everything); TensorRT-LLM
    # reads top_k = top_p = 0 as greedy, so top_p is passed as given.
    greedy = body.temperature == 0.0
    sampling = SamplingParams(temperature=body.temperature, top_p=0.0 if greedy else body.top_p, seed=body.seed or 0)
    request = GenerationRequest(
        runtime.request_id(),
        tuple(ids),
        max_tokens,
        end_id=tokenizer.eos_token_id,
        stop_words=tuple(tuple(tokenizer.encode(s)) for s in stops if s),
        sampling=sampling,
        exclude_input_in_output=True,
        return_perf_metrics=True,
    )
    return model, request


def _finish_reason(output: StepOutput) -> str:
    return "length" if output.reason == FinishReason.LENGTH else "stop"


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _generate(
    runtime: StandinRuntime, body: _Common, ids: list[int], max_tokens: int
) -> tuple[str, str, dict[str, int], str]:
    model, request = _prepare(runtime, body, ids, max_tokens)
    output = await asyncio.wrap_future(runtime.submit(model, request))
    if output.error is not None:
        raise ApiError(400, output.error)
    text = runtime.tokenizer.decode(output.tokens, skip_special_tokens=True)
    return text, _finish_reason(output), _usage(len(ids), len(output.tokens)), model


async def _stream(
    runtime: StandinRuntime, body: _Common, ids: list[int], max_tokens: int, kind: str, created: int
) -> StreamingResponse:
    """``stream: true``: Server-Sent Events, one chunk per verification step (each may accept several
    tokens). The first response is awaited before the stream starts, so a request the scheduler refuses
    gets the same JSON error, with its status, as a whole response; a later error is an SSE error event.

    The scheduler's sink runs on its thread; it hands each response to this event loop through
    ``call_soon_threadsafe``. When the loop is gone that raises, and the scheduler cancels the request.
    """
    model, request = _prepare(runtime, body, ids, max_tokens)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[StepOutput] = asyncio.Queue()

    def deliver(output: StepOutput) -> None:  # on the scheduler's thread
        loop.call_soon_threadsafe(queue.put_nowait, output)

    runtime.stream(model, request, deliver)
    try:
        first = await queue.get()
    except BaseException:
        runtime.cancel(request.request_id)
        raise
    if first.error is not None:
        raise ApiError(400, first.error)
    usage = body.stream_options is not None and body.stream_options.include_usage
    events = _events(runtime, request.request_id, kind, model, created, len(ids), first, queue, usage)
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(
    runtime: StandinRuntime,
    request_id: str,
    kind: str,
    model: str,
    created: int,
    prompt_tokens: int,
    output: StepOutput,
    queue: asyncio.Queue[StepOutput],
    include_usage: bool,
) -> AsyncIterator[str]:
    """The chunks of one streamed answer. Each delta is the new suffix of the whole answer decoded so far,
    held back while that ends in U+FFFD (a character whose bytes are split across tokens), so the deltas
    joined equal the whole response's text. A client that goes away cancels the request."""
    chat = kind == "chat.completion.chunk"
    tokens: list[int] = []
    sent = ""
    done = False

    def chunk(text: str | None, reason: str | None, role: bool = False) -> str:
        if chat:
            delta = {"role": "assistant", "content": ""} if role else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        event = {"id": request_id, "object": kind, "created": created, "model": model, "choices": [choice]}
        return _sse(event | ({"usage": None} if include_usage else {}))

    try:
        if chat:
            yield chunk(None, None, role=True)
        while True:
            tokens += output.tokens
            if output.error is not None:
                done = True
                yield _sse({"error": {"message": output.error, "type": "server_error", "code": None}})
                break
            text = runtime.tokenizer.decode(tokens, skip_special_tokens=True)
            if output.finished:
                done = True
                yield chunk(text[len(sent) :], _finish_reason(output))
                if include_usage:
                    event = {"id": request_id, "object": kind, "created": created, "model": model, "choices": []}
                    yield _sse(event | {"usage": _usage(prompt_tokens, len(tokens))})
                break
            if len(text) > len(sent) and text.startswith(sent) and not text.endswith("\ufffd"):
                yield chunk(text[len(sent) :], None)
                sent = text
            output = await queue.get()
        yield _sse("[DONE]")
    finally:
        if not done:  # the client went away (the stream was cancelled or closed): stop generating
            runtime.cancel(request_id)


def _answer(
    kind: str, runtime: StandinRuntime, model: str, choice: dict[str, Any], usage: dict[str, int], created: int
) -> dict[str, Any]:
    return {
        "id": runtime.request_id(),
        "object": kind,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }
