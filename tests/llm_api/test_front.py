"""The name-routing front (pipeline/llm_api/front.py) with the ``openai`` client: a fine-tune chosen by
``model`` reaches trtllm-serve as the ``lora_request`` it reads, whole and streamed answers name the
model asked for, and what the front refuses is answered as OpenAI answers it.

trtllm-serve cannot run here; ``RecordingTrtllmServe`` stands in for it: it records each body it gets
and answers in trtllm-serve's shape (OpenAI's), echoing which adapter it was asked for."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from pipeline.llm_api.front import make_front, route
from tests.conftest import REPO
from tests.servers import app_in_thread, free_ports

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


def test_the_kubernetes_front_container_s_command_serves_the_fine_tunes(received, tmp_path):
    """``python -m pipeline.llm_api.front`` as the manifests' front container runs it, on serve.json."""
    serve_json = tmp_path / "serve.json"
    serve_json.write_text(json.dumps(SERVE))
    (port,) = free_ports(1)
    with app_in_thread(RecordingTrtllmServe(received)) as upstream:
        argv = [
            sys.executable,
            "-m",
            "pipeline.llm_api.front",
            str(serve_json),
            "--base",
            "base",
            "--upstream",
            upstream,
        ]
        front = subprocess.Popen([*argv, "--host", "127.0.0.1", "--port", str(port)], cwd=tmp_path)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120  # a generous deadline: the host may be loaded
            while not _answers(url + "/health"):
                assert front.poll() is None, "the front exited"
                assert time.monotonic() < deadline, "the front did not answer /health within 120 s"
                time.sleep(0.1)
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
            answer = client.completions.create(model="json", prompt="{", max_tokens=4)
            assert answer.choices[0].text == "adapter json" and answer.model == "json"
            assert received[-1]["lora_request"] == SERVE["fine_tunes"]["json"]
        finally:
            front.terminate()
            front.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.mark.parametrize(
    ("content", "says"), [(None, "No such file"), ("{not json", "Expecting"), ("[]", "no fine_tunes")]
)
def test_the_front_refuses_a_serve_json_it_cannot_read(tmp_path, content, says):
    serve_json = tmp_path / "serve.json"
    if content is not None:
        serve_json.write_text(content)
    argv = [sys.executable, "-m", "pipeline.llm_api.front", str(serve_json), "--base", "b", "--upstream", "http://x"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert str(serve_json) in done.stderr and "Traceback" not in done.stderr


def test_the_front_needs_none_of_specdeploy_s_heavy_dependencies():
    """The front's image needs fastapi, uvicorn and httpx only (deploy.front_image)."""
    code = "import sys, uvicorn, pipeline.llm_api.front; print(sorted({m.split('.')[0] for m in sys.modules}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    loaded = set(ast.literal_eval(done.stdout))
    assert not loaded & {"torch", "numpy", "transformers", "yaml", "tritonclient", "safetensors", "modelopt"}


DOCKERFILE = REPO / "examples" / "kubernetes" / "front.Dockerfile"


def test_the_front_image_recipe_holds_what_the_front_needs(tmp_path):
    """The Dockerfile's COPY lines are enough to run the front, and it pins what pyproject.toml pins."""
    lines = DOCKERFILE.read_text().splitlines()
    copies = [line.split()[1:] for line in lines if line.startswith("COPY ")]
    for source, target in copies:
        (tmp_path / target.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / target.lstrip("/")).write_bytes((REPO / source).read_bytes())
    code = "import pipeline.llm_api.front as f, sys; print(f.__file__); sys.exit(f.main(['--help']))"
    # -S: no site hooks (this checkout's editable install would answer for pipeline), the packages by path.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "app"), sysconfig.get_paths()["purelib"]])}
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(tmp_path / "app" / "pipeline" / "llm_api" / "front.py")), done.stdout
    (install,) = [line for line in lines if line.startswith("RUN pip install")]
    pinned = {name: f"{name}=={metadata.version(name)}" for name in ("fastapi", "uvicorn", "httpx")}
    assert set(pinned.values()) <= set(install.split()), install
