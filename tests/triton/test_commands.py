"""serve/query/bench without a server: argument handling, GPU command, request building, statistics."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path

import numpy as np
import pytest
from triton_fixtures import fake_engine, make_model_dir, plan_spec

from pipeline.client import GenerationRequest, GenerationResult, Piece, build_inputs
from pipeline.client.load import (
    LoadRun,
    RequestRecord,
    batch_mix,
    inter_token_latencies,
    load_prompts,
    openai_steps,
    summarize,
)
from pipeline.commands import serve as serve_command
from pipeline.errors import InputError
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.triton.repository import emit_repository

TP2_SPEC = """
name: gpu
model: {path: model}
parallel: {tp: 2}
target: tensorrt
gpu: {type: l40s, count: 2}
"""


@pytest.fixture
def gpu_spec(tmp_path) -> Path:
    make_model_dir(tmp_path / "model")
    spec = tmp_path / "gpu.yaml"
    spec.write_text(textwrap.dedent(TP2_SPEC).lstrip())
    return spec


def test_print_command_for_a_gpu_variant_has_one_rank_per_gpu_and_the_cli_ports(cli, gpu_spec):
    rc, out, err = cli(
        "serve",
        str(gpu_spec),
        "--print-command",
        "--grpc-port",
        "9101",
        "--http-port",
        "9100",
        "--metrics-port",
        "9102",
    )
    assert rc == 0, err
    argv = shlex.split(out.strip())
    assert argv[:2] == ["mpirun", "--allow-run-as-root"] and argv.count("-n") == 2
    assert "--grpc-port=9101" in argv and "--allow-http=false" in argv  # HTTP needs serving.http: true


def test_gpu_variant_on_a_host_without_gpus_prints_the_command_and_exits_3(cli, gpu_spec, tmp_path, monkeypatch):
    monkeypatch.setattr(serve_command, "_gpu_host", lambda: False)
    variant = plan_spec(gpu_spec, tmp_path).variants[0]
    emit_repository(
        variant, variant.stage("package").output, engine_dir=fake_engine(variant), tokenizer_dir=variant.model_dir
    )
    rc, out, _ = cli("serve", str(gpu_spec))
    assert rc == 3 and "no GPU on this host" in out and "mpirun" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        ((), "no Triton repository for variant"),
        (("--print-command",), "--print-command is for target tensorrt"),
        (("--grpc-port", "8000"), "ports must differ"),
        (("--variant", "nope"), "has no variant 'nope'"),
    ],
)
def test_serve_input_errors_are_one_line(cli, tmp_path, extra, message):
    make_model_dir(tmp_path / "model")
    spec = tmp_path / "ref.yaml"
    spec.write_text("name: ref\nmodel: {path: model}\ntarget: reference\n")
    rc, _, err = cli("serve", str(spec), *extra)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


def test_variants_that_cannot_share_a_server_are_served_one_at_a_time(cli):
    """The example 8B fleet overflows its two L40S when served together: `serve` says so and how."""
    rc, _, err = cli("serve", str(Path(__file__).resolve().parents[2] / "specs" / "llama8b-fleet.yaml"))
    assert rc == 2 and "the variants cannot share one server (GPU 0 (l40s" in err and "--variant NAME" in err
    assert len(err.strip().splitlines()) == 1


def test_serving_a_whole_spec_needs_its_repository(cli, tmp_path):
    make_model_dir(tmp_path / "model")
    spec = tmp_path / "two.yaml"
    spec.write_text("name: two\nmodel: {path: model}\ntarget: reference\nvariants: [{name: a}, {name: b}]\n")
    rc, _, err = cli("serve", str(spec))
    assert rc == 2 and "no Triton repository for spec two" in err and "specdeploy engine" in err


def test_bench_with_a_missing_prompts_file_is_an_input_error(cli, tmp_path):
    rc, _, err = cli("bench", "--prompts", str(tmp_path / "none.txt"), "--url", "127.0.0.1:1")
    assert rc == 2 and "cannot read prompts" in err


def test_bench_probe_host_needs_the_repository(cli, tmp_path):
    rc, _, err = cli("bench", "--prompts", str(tmp_path / "none.txt"), "--url", "127.0.0.1:1", "--probe-host")
    assert rc == 2 and "--probe-host" in err and "--repository DIR" in err and err.count("\n") == 1


def test_prompt_files(tmp_path):
    (tmp_path / "p.txt").write_text("one\n\n two \n")
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"text": "b"}\n')
    (tmp_path / "p.json").write_text('["x", {"prompt": "y"}]')
    (tmp_path / "empty.txt").write_text("\n \n")
    assert load_prompts(tmp_path / "p.txt") == ["one", " two "]
    assert load_prompts(tmp_path / "p.jsonl") == ["a", "b"]
    assert load_prompts(tmp_path / "p.json") == ["x", "y"]
    with pytest.raises(InputError, match="no prompts"):
        load_prompts(tmp_path / "empty.txt")


def test_request_tensors_have_a_batch_of_one_and_triton_dtypes():
    inputs = build_inputs(
        GenerationRequest(
            "hi",
            max_tokens=5,
            temperature=0.5,
            seed=3,
            stop_words=("x", "y"),
            return_perf_metrics=True,
            lookahead=LookaheadConfig(2, 2, 1),
        )
    )
    by_name = {tensor.name(): tensor for tensor in inputs}
    assert by_name["text_input"].shape() == [1, 1] and by_name["text_input"].datatype() == "BYTES"
    assert by_name["max_tokens"].datatype() == "INT32" and by_name["seed"].datatype() == "UINT64"
    assert by_name["temperature"].datatype() == "FP32" and by_name["stream"].datatype() == "BOOL"
    assert by_name["stop_words"].shape() == [1, 2] and by_name["lookahead_window_size"].shape() == [1, 1]
    plain = {tensor.name() for tensor in build_inputs(GenerationRequest("hi"))}
    assert plain == {"text_input", "max_tokens", "stream"}  # unset options stay server defaults


def test_mean_acceptance_length_counts_generation_steps():
    # 1 token from the context step, then 3 steps accepting 2, 0 and 1 drafts: 1 + 3 + 1 + 2 = 7 tokens.
    result = GenerationResult(
        [Piece("", 1, 0.1), Piece("", 3, 0.2), Piece("", 1, 0.3), Piece("", 2, 0.4)],
        {"total_accepted_draft_tokens": 3, "total_draft_tokens": 12},
    )
    assert result.mean_acceptance_length == pytest.approx(6 / 3)


def test_summary_spreads_a_multi_token_step_over_its_tokens():
    record = RequestRecord(
        0,
        0.0,
        ok=True,
        tokens=4,
        ttft=0.1,
        total=0.4,
        steps=[(0.1, 1), (0.3, 2), (0.4, 1)],
        perf={"total_accepted_draft_tokens": 1, "total_draft_tokens": 4},
    )
    assert inter_token_latencies(record) == pytest.approx([0.1, 0.1, 0.1])
    failed = RequestRecord(1, 0.0, error="boom")
    summary = summarize(LoadRun(2, 2.0, [record, failed]))
    assert summary["completed"] == 1 and summary["failed"] == 1 and summary["errors"] == ["boom"]
    assert summary["tokens_per_second"] == 2.0
    assert summary["itl_ms"]["p50"] == pytest.approx(100.0) and summary["ttft_ms"]["p99"] == pytest.approx(100.0)
    assert summary["acceptance"]["acceptance_rate"] == 0.25
    assert summary["acceptance"]["mean_acceptance_length"] == pytest.approx(3 / 2)
    json.dumps(summary)  # JSON-ready
    assert np.isfinite(summary["latency_ms"]["mean"])


def streamed(index: int, started: float, *arrivals: float) -> RequestRecord:
    """A request sent at ``started`` whose responses (one token each) arrive at ``arrivals`` (run seconds)."""
    steps = [(at - started, 1) for at in arrivals]
    return RequestRecord(index, started, ok=True, tokens=len(steps), total=steps[-1][0], steps=steps)


def test_batch_mix_counts_the_decode_steps_by_requests_decoding():
    # A: prefill answered at 0 s, then steps at 1..5 s; B: prefill at 0 s, steps at 1, 2, 3 s.
    a, b = streamed(0, 0.0, 0, 1, 2, 3, 4, 5), streamed(1, 0.0, 0, 1, 2, 3)
    assert batch_mix([a, b]) == pytest.approx({1: 0.4, 2: 0.6})  # 3 steps of both, then 2 of A alone
    # the same step's responses reach the two clients 10 ms apart: still one step of two
    late = streamed(1, 0.0, 0.01, 1.01, 2.01, 3.01)
    assert batch_mix([a, late]) == pytest.approx({1: 0.4, 2: 0.6})
    # one request alone, then a second one sent after it ended: every step had one request
    assert batch_mix([streamed(0, 0.0, 0, 1, 2), streamed(1, 2.5, 3, 4, 5)]) == {1: 1.0}


def test_openai_chunks_become_steps_the_first_one_token():
    # 6 tokens in 3 chunks: the prefill's 1, then the other 5 spread 3 + 2 (the earlier chunk the remainder)
    assert openai_steps((0.5, 0.7, 0.8), 6) == [(0.5, 1), (0.7, 3), (0.8, 2)]
    assert openai_steps((0.5,), 4) == [(0.5, 4)]  # one chunk: the whole answer
    assert openai_steps((), 0) == []
    # more chunks than tokens left (no usage sent): chunks of 0 add no inter-token latency
    record = RequestRecord(0, 0.0, ok=True, tokens=2, steps=openai_steps((0.1, 0.2, 0.3), 2))
    assert record.steps == [(0.1, 1), (0.2, 1), (0.3, 0)] and inter_token_latencies(record) == pytest.approx([0.1])


def test_batch_mix_is_empty_without_streamed_steps():
    whole = RequestRecord(0, 0.0, ok=True, tokens=8, total=1.0, steps=[(1.0, 8)])  # one response: no steps seen
    assert batch_mix([whole, RequestRecord(1, 0.0, error="boom")]) == {}
    summary = summarize(LoadRun(2, 2.0, [streamed(0, 0.0, 0, 1, 2, 3, 4, 5), streamed(1, 0.0, 0, 1, 2, 3)]))
    assert summary["batch_mix"] == pytest.approx({"1": 0.4, "2": 0.6})  # bench.json's keys are strings


def test_bench_ignore_eos_sends_an_end_id_no_token_matches():
    import argparse

    from pipeline.commands.query import request_from_args

    args = argparse.Namespace(max_tokens=8, temperature=None, top_k=None, top_p=None, seed=None, stop=None)
    assert request_from_args(args, "hi", perf=True).end_id is None  # the tokenizer's EOS, as preprocessing sets it
    args.ignore_eos = True
    assert request_from_args(args, "hi", perf=True).end_id == -1


def test_summary_of_several_models_adds_up_per_model():
    # two fine-tunes, round-robin: code got 3 + 5 tokens, json 4 tokens and one failure, in 2 s
    records = [
        RequestRecord(0, 0.0, ok=True, tokens=3, ttft=0.1, total=0.3, model="code"),
        RequestRecord(1, 0.0, ok=True, tokens=4, ttft=0.2, total=0.4, model="json"),
        RequestRecord(2, 0.5, ok=True, tokens=5, ttft=0.1, total=0.5, model="code"),
        RequestRecord(3, 0.5, error="boom", model="json"),
    ]
    summary = summarize(LoadRun(2, 2.0, records))
    assert summary["output_tokens"] == 12 and summary["tokens_per_second"] == 6.0
    code, json_ = summary["per_model"]["code"], summary["per_model"]["json"]
    assert (code["completed"], code["output_tokens"], code["tokens_per_second"]) == (2, 8, 4.0)
    assert (json_["completed"], json_["failed"], json_["tokens_per_second"], json_["errors"]) == (1, 1, 2.0, ["boom"])
    assert "per_model" not in summarize(LoadRun(1, 1.0, records[:1]))  # one model: the total alone


def test_packaged_chat_template_renders_like_the_tokenizer(tmp_path):
    """The template the package stage stores in preprocessing's config renders what HF renders,
    less a BOS that preprocessing adds itself."""
    from transformers import AutoTokenizer
    from triton_fixtures import make_tokenizer

    from pipeline.client.chat import PARAMETER, ChatTemplate, preprocessing_model, served_template, template_parameter

    folder = make_tokenizer(tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(folder)
    value = template_parameter(folder, add_special_tokens=True)[PARAMETER]
    template = served_template({"parameters": {PARAMETER: {"string_value": value}}}, "test")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    want = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert template.render("hello", "be brief") == want  # this tokenizer adds no BOS: nothing stripped
    with_bos = ChatTemplate(template.template, {"bos_token": "<s>"}, strip_prefix="<s>")
    assert with_bos.render("hello") == "[user] hello "
    assert served_template({"parameters": {}}, "test") is None
    with pytest.raises(InputError, match=PARAMETER):
        served_template({"parameters": {PARAMETER: {"string_value": "{not json"}}}, "server")
    assert preprocessing_model({"ensemble_scheduling": {"step": [{"model_name": "pre"}]}}) == "pre"
    assert preprocessing_model({"parameters": {"specdeploy_steps": {"string_value": '[{"model": "p2"}]'}}}) == "p2"


def test_shutdown_log_with_only_ensembles_in_flight_is_a_leak():
    from pipeline.triton.launch_cpu import only_leaked_ensembles

    def tick(n: int, *models: str) -> str:
        lines = [f'I0 server.cc:321] "Timeout {n}: Found {len(models)} model versions that have in-flight inferences"']
        lines += [f"I0 server.cc:325] \"Model '{m}' (version 1) has 1 in-flight inferences\"" for m in models]
        return "\n".join(lines) + "\n"

    leaked = tick(30, "ensemble") + tick(29, "ensemble") + tick(28, "ensemble") + tick(27, "ensemble")
    assert only_leaked_ensembles(leaked, {"ensemble"})
    assert not only_leaked_ensembles(leaked, {"chat"})  # another model: a real request is draining
    draining = tick(30, "ensemble", "tensorrt_llm") + tick(29, "ensemble") + tick(28, "ensemble") + tick(27)
    assert not only_leaked_ensembles(draining, {"ensemble"})  # tensorrt_llm was still working 3 ticks ago
    assert not only_leaked_ensembles(tick(30, "ensemble") + tick(29, "ensemble"), {"ensemble"})  # too soon
