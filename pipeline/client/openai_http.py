"""One request to an OpenAI-compatible server (``trtllm-serve``, or its CPU stand-in), with the
standard library: ``/v1/chat/completions`` (the server applies the chat template) or
``/v1/completions`` (raw text). Used by ``specdeploy query --url http://HOST:PORT``."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from pipeline.client.stream import ClientError


@dataclass(frozen=True)
class Completion:
    text: str
    completion_tokens: int
    seconds: float
    finish_reason: str | None


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)
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
    started = time.perf_counter()
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        answer = _post(f"{root}/v1/chat/completions", body | {"messages": messages}, timeout)
        choice = answer["choices"][0]
        text = choice["message"]["content"]
    else:
        answer = _post(f"{root}/v1/completions", body | {"prompt": prompt}, timeout)
        choice = answer["choices"][0]
        text = choice["text"]
    seconds = time.perf_counter() - started
    return Completion(
        text, int(answer.get("usage", {}).get("completion_tokens", 0)), seconds, choice.get("finish_reason")
    )


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
