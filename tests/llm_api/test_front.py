"""The name-routing front (pipeline/llm_api/front.py) with the ``openai`` client: a fine-tune chosen by
``model`` reaches trtllm-serve as the ``lora_request`` it reads, whole and streamed answers name the
model asked for, and what the front refuses is answered as OpenAI answers it.

trtllm-serve cannot run here; ``RecordingTrtllmServe`` stands in for it: it records each body it gets
and answers in trtllm-serve's shape (OpenAI's), echoing which adapter it was asked for."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from pipeline.llm_api.front import make_front, route
from tests.servers import app_in_thread

SERVE = {
    "health": "/health",
    "fine_tunes": {
        "code": {"lora_name": "code", "lora_int_id": 1, "lora_path": "/models/engines/base/lora/1"},
        "json": {"lora_name": "json", "lora_int_id": 2, "lora_path": "/models/engines/base/lora/2"},
    },
}


def test_route_adds_the_fine_tune_s_lora_request_and_names_the_base():
    tunes = SERVE["fine_tunes"]
    assert route({"model": "json", "prompt": "x"}, "base", tunes) == {
        "model": "base",
        "prompt": "x",
        "lora_request": tunes["json"],
    }
    assert route({"model": "base", "prompt": "x"}, "base", tunes) == {"model": "base", "prompt": "x"}


def RecordingTrtllmServe(received: list[dict[str, Any]]) -> FastAPI:  # noqa: N802 (a stand-in's name)
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        received.append(body)
        adapter = (body.get("lora_request") or {}).get("lora_name", "none")
        answer = {"id": "c", "object": "text_completion", "model": body["model"], "created": 0}
        if not body.get("stream"):
            return answer | {"choices": [{"index": 0, "text": f"adapter {adapter}", "finish_reason": "stop"}]}

        def events() -> Iterator[str]:
            for piece in ("adapter ", adapter):
                chunk = answer | {"choices": [{"index": 0, "text": piece, "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def received() -> list[dict[str, Any]]:
    return []


@pytest.fixture(scope="module")
def client(received) -> Iterator[openai.OpenAI]:
    with app_in_thread(RecordingTrtllmServe(received)) as upstream:
        with app_in_thread(make_front(SERVE, "base", upstream)) as front:
            yield openai.OpenAI(base_url=front + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_a_fine_tune_is_chosen_by_model(client, received):
    answer = client.completions.create(model="code", prompt="def f():", max_tokens=4)
    assert answer.choices[0].text == "adapter code" and answer.model == "code"
    assert received[-1]["model"] == "base" and received[-1]["lora_request"] == SERVE["fine_tunes"]["code"]
    answer = client.completions.create(model="base", prompt="hi", max_tokens=4)
    assert answer.choices[0].text == "adapter none" and "lora_request" not in received[-1]


def test_a_streamed_answer_names_the_model_asked_for(client):
    chunks = list(client.completions.create(model="json", prompt="{", max_tokens=4, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "adapter json"
    assert {c.model for c in chunks} == {"json"}


def test_models_lists_the_variant_and_its_fine_tunes(client):
    assert [m.id for m in client.models.list()] == ["base", "code", "json"]


def test_what_the_front_refuses(client, received):
    before = len(received)
    with pytest.raises(openai.NotFoundError, match="The model `nope` does not exist"):
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="the front chooses a fine-tune by model"):
        client.completions.create(
            model="base", prompt="x", max_tokens=1, extra_body={"lora_request": {"lora_name": "mine"}}
        )
    assert len(received) == before  # nothing reached trtllm-serve
