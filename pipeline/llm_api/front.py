"""A name-routing front for ``trtllm-serve``: an OpenAI client chooses a fine-tune by ``model``, as it
does on any OpenAI-compatible server, and the front turns the name into the ``lora_request`` that
trtllm-serve reads.

trtllm-serve serves the one model it was started with and never checks a request's ``model``; a LoRA
fine-tune is reached only by the body's ``lora_request`` (``lora_name``, ``lora_int_id``,
``lora_path``; tensorrt_llm/serve/openai_server.py, pipeline/targets/pytorch_sources.json). A client
written for OpenAI's API sends ``model: code`` and would be answered by the base. The front listens
where the deployment listens and forwards to trtllm-serve on the loopback:

* ``POST /v1/completions``, ``POST /v1/chat/completions``: ``model`` names the variant or one of its
  LoRA group's fine-tunes (``serve.json``'s ``fine_tunes``); a fine-tune's ``lora_request`` is added,
  ``model`` becomes the variant's name, and the answer (whole or streamed) names the model asked for.
  An unknown name is a 404, as OpenAI answers it; a ``lora_request`` of the client's own is refused
  (the front chooses adapters by name, and ``serving.lora_client_adapters`` is off by default);
* ``GET /v1/models``: the variant and its fine-tunes;
* ``GET /health``: trtllm-serve's.

``python -m pipeline.llm_api.front SERVE_JSON --base NAME --upstream URL --host H --port P`` runs it alone:
the Kubernetes manifests' ``front`` container (``deploy.front_image``), beside trtllm-serve on the pod's
loopback. It imports fastapi, uvicorn and httpx, nothing else of specdeploy's dependencies.

    >>> route({"model": "code", "prompt": "hi"}, "base", {"code": {"lora_name": "code", "lora_int_id": 1}})
    {'model': 'base', 'prompt': 'hi', 'lora_request': {'lora_name': 'code', 'lora_int_id': 1}}
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

ROUTED = ("/v1/completions", "/v1/chat/completions")


class RouteError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def route(body: dict[str, Any], base: str, fine_tunes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The body trtllm-serve gets for a client's ``body``: ``model`` the variant's name, a fine-tune's
    ``lora_request`` added. RouteError (status, message) for a body the front refuses."""
    model = body.get("model")
    if not isinstance(model, str):
        raise RouteError(400, "model: a string naming the variant or one of its fine-tunes")
    if "lora_request" in body:
        raise RouteError(400, f"lora_request: the front chooses a fine-tune by model ({', '.join(fine_tunes)})")
    if model != base and model not in fine_tunes:
        raise RouteError(404, f"The model `{model}` does not exist.", code="model_not_found")
    routed = {**body, "model": base}
    if model in fine_tunes:
        routed["lora_request"] = dict(fine_tunes[model])
    return routed


def make_front(serve: dict[str, Any], base: str, upstream: str, timeout_s: float = 600.0) -> FastAPI:
    """The front's app for one variant's ``serve.json`` (``serve``; ``base``: the variant's name) in front
    of trtllm-serve at ``upstream`` (``http://127.0.0.1:PORT``)."""
    fine_tunes: dict[str, dict[str, Any]] = serve.get("fine_tunes") or {}
    client = httpx.AsyncClient(base_url=upstream, timeout=timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(title="specdeploy front for trtllm-serve", lifespan=lifespan)
    created = int(time.time())

    @app.get("/health")
    async def health() -> Response:
        try:
            answer = await client.get(serve.get("health") or "/health")
        except httpx.HTTPError as exc:
            return _error(503, f"trtllm-serve at {upstream} does not answer ({type(exc).__name__})", "unavailable")
        return Response(status_code=answer.status_code)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        names = [base, *fine_tunes]
        data = [{"id": n, "object": "model", "created": created, "owned_by": "specdeploy"} for n in names]
        return {"object": "list", "data": data}

    async def forward(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the body is not a JSON object")
        try:
            routed = route(body, base, fine_tunes)
        except RouteError as exc:
            return _error(exc.status, exc.message, code=exc.code)
        asked = body["model"]
        upstream_request = client.build_request("POST", request.url.path, json=routed)
        try:
            answer = await client.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            return _error(503, f"trtllm-serve at {upstream} does not answer ({type(exc).__name__})", "unavailable")
        if answer.headers.get("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(_renamed_events(answer, asked), media_type="text/event-stream")
        content = await answer.aread()
        await answer.aclose()
        return Response(_renamed(content, asked), answer.status_code, media_type="application/json")

    for path in ROUTED:
        app.add_api_route(path, forward, methods=["POST"])
    return app


def _error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=status)


def _renamed(content: bytes, model: str) -> bytes:
    """A JSON answer naming ``model`` (an error, or anything not an object, passes unchanged)."""
    try:
        data = json.loads(content)
    except ValueError:
        return content
    if isinstance(data, dict) and "model" in data:
        data["model"] = model
        return json.dumps(data).encode()
    return content


async def _renamed_events(answer: httpx.Response, model: str) -> AsyncIterator[bytes]:
    """The upstream's server-sent events, each ``data: {...}`` chunk naming ``model``."""
    try:
        async for line in answer.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                line = "data: " + _renamed(line[6:].encode(), model).decode()
            yield (line + "\n").encode()
    finally:
        await answer.aclose()


def main(argv: list[str] | None = None) -> int:
    """Serve the front for one variant's ``serve.json`` until stopped; 2 for a file it cannot read."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.llm_api.front",
        description="Serve the name-routing front before a LoRA group's trtllm-serve: a fine-tune by model name.",
    )
    parser.add_argument("serve_json", type=Path, help="the variant's serve.json (triton_repo/<variant>/serve.json)")
    parser.add_argument("--base", required=True, help="the variant's name: the model name that reaches the base")
    parser.add_argument("--upstream", required=True, help="trtllm-serve's address, e.g. http://127.0.0.1:18000")
    parser.add_argument("--host", default="127.0.0.1", help="where the front listens (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="its port (default: 8000)")
    args = parser.parse_args(argv)
    try:
        serve = json.loads(args.serve_json.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"error: {args.serve_json}: {exc}; point it at the package stage's serve.json", file=sys.stderr)
        return 2
    tunes = serve.get("fine_tunes") if isinstance(serve, dict) else None
    if not isinstance(tunes, dict) or not all(isinstance(t, dict) for t in tunes.values()):
        print(
            f"error: {args.serve_json}: no fine_tunes object; point it at the package stage's serve.json",
            file=sys.stderr,
        )
        return 2
    import uvicorn

    uvicorn.run(make_front(serve, args.base, args.upstream), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
