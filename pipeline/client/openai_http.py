"""One request to an OpenAI-compatible server (``trtllm-serve``, or its CPU stand-in), with the
standard library: ``/v1/chat/completions`` (the server applies the chat template) or
``/v1/completions`` (raw text), streamed (``stream: true``, Server-Sent Events) so that the first
token and each step's tokens are timed as they arrive. Used by ``specdeploy query --url
http://HOST:PORT`` and ``specdeploy bench --url``."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.client.stream import ClientError


@dataclass(frozen=True)
class Completion:
    text: str
    completion_tokens: int
    seconds: float
    finish_reason: str | None
    first_token_seconds: float | None = None  # when the first text arrived (None: no text)
    deltas: tuple[float, ...] = ()  # when each chunk with text arrived, seconds after the request


def _events(url: str, body: dict[str, Any], timeout: float) -> Iterator[dict[str, Any]]:
    """The server's streamed chunks (each ``data: {...}`` event) until ``data: [DONE]``."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise ClientError(f"{url}: {chunk['error'].get('message', chunk['error'])}")
                yield chunk
    except urllib.error.HTTPError as exc:
        try:
            message = json.load(exc).get("error", {}).get("message") or exc.reason
        except ValueError:
            message = exc.reason
        raise ClientError(f"{url}: {exc.code} {message}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ClientError(f"{url}: {reason}; is the server running (`specdeploy serve SPEC`)?") from None


def complete(
    base_url: str, model: str, prompt: str, *, chat: bool, system: str | None, timeout: float, **sampling: Any
) -> Completion:
    """``prompt`` to ``model`` at ``base_url`` (``http://host:port``); ``sampling``: max_tokens, temperature, ..."""
    root = base_url.rstrip("/").removesuffix("/v1")
    body: dict[str, Any] = {"model": model, **{k: v for k, v in sampling.items() if v is not None}}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        url, body = f"{root}/v1/chat/completions", body | {"messages": messages}
    else:
        url, body = f"{root}/v1/completions", body | {"prompt": prompt}
    started = time.perf_counter()
    pieces, deltas, tokens, reason = [], [], 0, None
    for chunk in _events(url, body, timeout):
        for choice in chunk.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if piece:
                pieces.append(piece)
                deltas.append(time.perf_counter() - started)
            reason = choice.get("finish_reason") or reason
        tokens = int((chunk.get("usage") or {}).get("completion_tokens", tokens))
    seconds = time.perf_counter() - started
    return Completion("".join(pieces), tokens, seconds, reason, deltas[0] if deltas else None, tuple(deltas))


def standin_metrics(base_url: str, timeout: float = 10.0) -> dict[str, Any] | None:
    """The stand-in's /metrics (per model: draft and accepted tokens); None where the server has none
    in that form (trtllm-serve's /metrics is its iteration statistics)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(f"{root}/metrics", timeout=timeout) as response:
            data = json.load(response)
    except (urllib.error.URLError, TimeoutError, ConnectionError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("models"), dict) else None
