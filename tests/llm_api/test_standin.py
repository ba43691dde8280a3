"""specs/smollm2-lora-fleet-pytorch.yaml served by the CPU stand-in for trtllm-serve, queried with the
``openai`` package, the client users of an OpenAI-compatible server have: the base and all eight
shipped fine-tunes from one engine that speculates with NGram while it applies each request's adapter.

Correct answers come from outside the pipeline (tests/lora/fleet_fixtures.py: each adapter merged by
PEFT, decoded greedily by transformers); NGram is lossless, so every answer must equal its merged
model's while requests for all nine names are in flight together.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from urllib.request import urlopen

import openai
import pytest

from pipeline.llm_api.standin_runtime import StandinRuntime, load_standin
from pipeline.llm_api.standin_server import _events, make_app
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.runtime.request import FinishReason, StepOutput
from pipeline.spec.document import load_spec
from pipeline.stages.execute import execute_plan
from tests.conftest import embedded_cache_dir
from tests.lora.fleet_fixtures import FINE_TUNES, MIN_MARGIN, PROMPTS, TOKENS, peft_merged_answers
from tests.servers import app_in_thread

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runtime(module_tmp) -> Iterator[StandinRuntime]:
    root = module_tmp("pytorch-fleet")
    spec = load_spec(REPO / "specs" / "smollm2-lora-fleet-pytorch.yaml")
    plan = make_plan(spec, OutputRoots(root / "engines", root / "triton_repo", embedded_cache_dir()))
    outcomes = execute_plan(plan, only={"base"}, say=lambda _: None)
    assert all(o.stopped_at is None and o.exit_code == 0 for o in outcomes), outcomes
    scratch = module_tmp("scratch")
    loaded = load_standin(plan.variants[0], scratch, say=lambda _: None)
    try:
        yield loaded
    finally:
        loaded.stop()


@pytest.fixture(scope="module")
def url(runtime) -> Iterator[str]:
    with app_in_thread(make_app(runtime)) as base:
        yield base + "/v1"


@pytest.fixture(scope="module")
def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)


def complete(client: openai.OpenAI, model: str, prompt: str, **extra) -> str:
    answer = client.completions.create(model=model, prompt=prompt, max_tokens=TOKENS, temperature=0, **extra)
    return answer.choices[0].text


def test_every_fine_tune_by_name_equals_its_peft_merged_model_while_ngram_speculates(runtime, client):
    expected = peft_merged_answers(("base", *FINE_TUNES), PROMPTS, TOKENS)
    tokenizer = runtime.tokenizer
    assert runtime.method == "ngram"
    assert sorted(m.id for m in client.models.list().data) == sorted(("base", *FINE_TUNES))
    jobs = [(name, prompt) for name in ("base", *FINE_TUNES) for prompt in PROMPTS]
    with ThreadPoolExecutor(len(jobs)) as pool:  # every adapter and the base in flight together
        futures = {job: pool.submit(complete, client, *job) for job in jobs}
        answers = {job: future.result() for job, future in futures.items()}
    for (name, prompt), text in answers.items():
        tokens, margin = expected[name, prompt]
        assert margin > MIN_MARGIN, (name, prompt, margin)  # no near-tie that float rounding could flip
        assert text == tokenizer.decode(tokens, skip_special_tokens=True), (name, prompt)
    changed = {name for name in FINE_TUNES for p in PROMPTS if expected[name, p][0] != expected["base", p][0]}
    assert len(changed) >= len(FINE_TUNES) // 2, changed  # the adapters do change the text
    with urlopen(str(client.base_url).replace("/v1/", "/metrics"), timeout=60) as response:
        metrics = json.load(response)
    assert metrics["method"] == "ngram"
    drafted = {name: m["draft_tokens"] for name, m in metrics["models"].items()}
    assert sum(drafted.values()) > 0 and sum(m["accepted_draft_tokens"] for m in metrics["models"].values()) > 0
    assert drafted["code"] > 0  # a fine-tune's requests speculate too (the engine flow's would not)


def test_a_fine_tune_by_lora_request_as_trtllm_serve_takes_it(runtime, client):
    # trtllm-serve never checks `model`: the body's lora_request picks the adapter (serve.json lists them)
    request = {"lora_name": "json", "lora_int_id": runtime.adapters["json"], "lora_path": "/models/x"}
    prompt = PROMPTS[2]
    assert complete(client, "checkpoint-or-anything", prompt, extra_body={"lora_request": request}) == complete(
        client, "json", prompt
    )


def test_chat_completions_apply_the_chat_template(client):
    answer = client.chat.completions.create(
        model="json", messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0
    )
    assert answer.choices[0].message.content.startswith('{"answer"')
    assert answer.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"model": "nope"}, openai.NotFoundError, "The model `nope` does not exist."),
        (
            {
                "model": "base",
                "extra_body": {"lora_request": {"lora_name": "mine", "lora_int_id": 9, "lora_path": "/"}},
            },
            openai.BadRequestError,
            "not a deployed fine-tune",
        ),
        ({"model": "base", "max_tokens": 0}, openai.BadRequestError, "max_tokens"),
        ({"model": "nope", "stream": True}, openai.NotFoundError, "The model `nope` does not exist."),
        # refused by the scheduler before the first chunk: the same JSON error as a whole response
        (
            {"model": "base", "stream": True, "max_tokens": 4000},
            openai.BadRequestError,
            "exceed the engine's max_seq_len",
        ),
        (
            {"model": "base", "stream_options": {"include_usage": True}},
            openai.BadRequestError,
            "only allowed when stream is true",
        ),
    ],
)
def test_bad_requests_get_one_line_errors_and_the_server_keeps_serving(client, kwargs, error, text):
    options = {"prompt": "Hello", "max_tokens": 4, "temperature": 0} | kwargs
    with pytest.raises(error) as info:
        client.completions.create(**options)
    assert text in str(info.value)
    assert complete(client, "base", "Hello")  # still answering


# (route, model, extra arguments): the base and a fine-tune by name, a long answer, a stop string, and a
# chat answer that ends by itself (finish_reason stop).
STREAMED = [
    ("completions", "base", {"prompt": PROMPTS[1], "max_tokens": 40}),
    ("completions", "code", {"prompt": PROMPTS[1], "max_tokens": 40}),
    ("completions", "base", {"prompt": PROMPTS[0], "max_tokens": 40, "stop": ["."]}),
    ("chat", "json", {"messages": [{"role": "user", "content": "What is the capital of France?"}]}),
    ("chat", "base", {"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 40}),
]


@pytest.mark.parametrize(("route", "model", "extra"), STREAMED)
def test_a_streamed_answer_joins_to_the_whole_answer(client, route, model, extra):
    create = client.completions.create if route == "completions" else client.chat.completions.create
    whole = create(model=model, temperature=0, **extra)
    chunks = list(create(model=model, temperature=0, stream=True, stream_options={"include_usage": True}, **extra))
    *content, usage = chunks
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None and len(c.choices) == 1 for c in content)
    assert len({c.id for c in chunks}) == 1 and all(c.model == model for c in chunks)
    if route == "completions":
        assert all(c.object == "text_completion" for c in chunks)
        deltas = [c.choices[0].text for c in content]
        expected = whole.choices[0].text
    else:
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        first, *content = content
        assert first.choices[0].delta.role == "assistant" and not first.choices[0].delta.content
        assert all(c.choices[0].delta.role is None for c in content)
        deltas = [c.choices[0].delta.content or "" for c in content]
        expected = whole.choices[0].message.content
    assert "".join(deltas) == expected
    assert len([d for d in deltas if d]) > 1  # tokens arrive step by step, not in one piece
    assert [c.choices[0].finish_reason for c in content] == [None] * (len(content) - 1) + [
        whole.choices[0].finish_reason
    ]


def test_a_character_split_across_tokens_is_sent_whole(runtime):
    tokenizer = runtime.tokenizer
    text = "Caf\u00e9 \U0001f642 and \u65e5\u672c ok"
    ids = tokenizer.encode(text)
    assert any(tokenizer.decode(ids[:n]).endswith("\ufffd") for n in range(1, len(ids)))  # a split character
    steps = [StepOutput("r", [token], False) for token in ids[:-1]] + [
        StepOutput("r", ids[-1:], True, FinishReason.LENGTH)
    ]

    async def events() -> list[str]:
        queue: asyncio.Queue[StepOutput] = asyncio.Queue()
        for step in steps[1:]:
            queue.put_nowait(step)
        stream = _events(runtime, "r", "text_completion", "base", 0, 1, steps[0], queue, False)
        return [event async for event in stream]

    *chunks, done = asyncio.run(events())
    assert done == "data: [DONE]\n\n"
    deltas = [json.loads(chunk.removeprefix("data: "))["choices"][0]["text"] for chunk in chunks]
    assert "".join(deltas) == text and not any("\ufffd" in d for d in deltas)


def test_a_stream_without_usage_ends_with_its_finish_reason(client):
    chunks = list(client.completions.create(model="base", prompt="Hello", max_tokens=4, temperature=0, stream=True))
    assert all(c.usage is None and len(c.choices) == 1 for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_client_that_leaves_a_stream_cancels_its_request(runtime, client, monkeypatch):
    last: Future[StepOutput] = Future()
    submit = runtime.scheduler.submit

    def watched(request, sink, is_cancelled=None):
        def tell(output: StepOutput) -> None:
            if output.finished:
                last.set_result(output)
            sink(output)

        submit(request, tell, is_cancelled)

    monkeypatch.setattr(runtime.scheduler, "submit", watched)
    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # counting on: no end before max_tokens
    stream = client.completions.create(model="base", prompt=prompt, max_tokens=1500, temperature=0, stream=True)
    assert next(iter(stream)).choices[0].finish_reason is None
    stream.close()
    output = last.result(timeout=600)
    assert output.reason == FinishReason.CANCELLED


def test_specdeploy_query_asks_a_fine_tune_by_name_and_reports_its_acceptance(cli, url):
    rc, out, err = cli("query", "def is_prime(n):", "--url", url, "--model", "code", "--no-chat", "--perf")
    assert rc == 0, err
    assert "return" in out  # the code fine-tune writes the function
    assert "-- code so far: acceptance rate" in out and "mean acceptance length" in out


def test_specdeploy_query_names_a_missing_fine_tune(cli, url):
    rc, out, err = cli("query", "Hello", "--url", url, "--model", "nope")
    assert rc != 0 and "404 The model `nope` does not exist." in err


def test_specdeploy_bench_loads_several_fine_tunes(cli, url, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def is_prime(n):\nName three colors.\n")
    out = tmp_path / "bench"
    rc, stdout, err = cli(
        "bench",
        "--url",
        url,
        "--models",
        "code,json",
        "--prompts",
        str(prompts),
        "--concurrency",
        "2",
        "--requests",
        "4",
        "--out",
        str(out),
        "--json",
    )
    assert rc == 0, err
    summary = json.loads(stdout)
    assert summary["completed"] == 4 and summary["tokens_per_second"] > 0
    assert (out / "bench.json").is_file()
    # streamed: the first token arrives before the answer ends, and the decode steps are timed
    assert summary["ttft_ms"]["mean"] < summary["latency_ms"]["mean"] and summary["itl_ms"]["p50"] is not None
