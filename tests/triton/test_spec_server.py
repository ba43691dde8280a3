"""`specdeploy serve SPEC`: three SmolLM2 variants (EAGLE, Medusa, a LoRA fine-tune with Lookahead)
served from one real tritonserver, requests to all three interleaved.

Correct answers come from outside Triton: the reference runtime's plain greedy decoding of each
variant's own engine (speculation is lossless in float32), decoded with the variant's tokenizer.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from pipeline.client import GenerationRequest, TritonClient
from pipeline.costmodel import calibrate, gemm_probe
from pipeline.geometry import ModelGeometry
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots, Plan, VariantPlan
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.request import GenerationRequest as RuntimeRequest
from pipeline.runtime.spec_decode.base import PlainDecoding
from pipeline.spec.document import load_spec
from pipeline.stages.execute import execute_plan, execute_spec_repository
from pipeline.triton.launch_cpu import reference_backend_available
from tests.conftest import embedded_cache_dir
from tests.runtime.drive import decode
from tests.servers import free_ports

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.slow,
    pytest.mark.smollm2,
    pytest.mark.skipif(not reference_backend_available(), reason="the reference backend is not in this checkout"),
]
REPO = Path(__file__).resolve().parents[2]
PROMPTS = ("def fibonacci(n):", "def is_prime(n):")
TOKENS = 12
SPEC = f"""
name: three
model: {{builtin: smollm2-135m-instruct, dtype: float32}}
heads:
  eagle: {{path: {REPO / "heads" / "smollm2-eagle"}}}
speculative:
  method: auto
  eagle: {{choices: cpu_small_10_depth_3}}
  medusa: {{choices: smollm2_medusa_10}}
  lookahead: {{window: 4, ngram: 3, verification_set: 4}}
build: {{max_batch_size: 4, max_input_len: 128, max_seq_len: 256, max_num_tokens: 512}}
target: reference
variants:
  - name: base
  - name: base-medusa
    heads:
      eagle: null
      medusa: {{path: {REPO / "heads" / "smollm2-medusa"}, num_heads: 3}}
  - name: json
    model: {{adapter: {REPO / "adapters" / "smollm2-json"}}}
    heads: null
    serving: {{lora: merged}}  # an engine of its own with Lookahead (auto would share the base's engine)
"""


@pytest.fixture(scope="module")
def plan(module_tmp) -> Plan:
    root = module_tmp("spec-server")
    (root / "spec.yaml").write_text(textwrap.dedent(SPEC).lstrip())
    plan = make_plan(
        load_spec(root / "spec.yaml"), OutputRoots(root / "engines", root / "triton_repo", embedded_cache_dir())
    )
    outcomes = execute_plan(plan, say=lambda _: None)
    assert all(o.stopped_at is None for o in outcomes), outcomes
    assert execute_spec_repository(plan, {o.variant for o in outcomes}, say=lambda _: None) is not None
    return plan


def plain_answers(variant: VariantPlan) -> dict[str, str]:
    """Greedy text of each prompt on the variant's own engine, without Triton."""
    tokenizer = AutoTokenizer.from_pretrained(variant.stage("package").inputs["tokenizer"])
    engine = Engine.load(variant.stage("build").output)
    requests = [
        RuntimeRequest(
            prompt, tuple(tokenizer.encode(prompt)), TOKENS, end_id=tokenizer.eos_token_id, exclude_input_in_output=True
        )
        for prompt in PROMPTS
    ]
    outputs = decode(engine, PlainDecoding(), requests, in_flight=1)
    return {p: tokenizer.decode(outputs[p].tokens, skip_special_tokens=True) for p in PROMPTS}


@pytest.fixture(scope="module")
def server(plan):
    """`specdeploy serve SPEC` as a user runs it, in its own process."""
    grpc, http, metrics = free_ports(3)
    spec = plan.spec_file
    roots = ["--engines-dir", str(spec.parent / "engines"), "--triton-repo", str(spec.parent / "triton_repo")]
    argv = [sys.executable, "-m", "pipeline", *roots, "--cache-dir", str(embedded_cache_dir()), "serve", str(spec)]
    argv += ["--grpc-port", str(grpc), "--http-port", str(http), "--metrics-port", str(metrics)]
    log = spec.parent / "serve.log"
    with log.open("w") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, cwd=spec.parent, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 600
        while "ready" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        yield f"127.0.0.1:{grpc}"
    finally:
        process.terminate()
        process.wait(timeout=120)


def ask(url: str, model: str, prompt: str) -> tuple[str, dict[str, float]]:
    with TritonClient(url, model) as client:
        request = GenerationRequest(prompt, max_tokens=TOKENS, return_perf_metrics=True)
        result = client.generate(request, timeout=300)
    return result.text, result.perf


def test_one_server_answers_every_variant_with_its_own_model_and_method(plan, server):
    expected = {variant.name: plain_answers(variant) for variant in plan.variants}
    assert expected["json"] != expected["base"]  # the fine-tune answers differently: routing is visible
    jobs = [(variant, prompt) for prompt in PROMPTS for variant in expected]  # base, medusa, json, base, ...
    with ThreadPoolExecutor(len(jobs)) as pool:  # all in flight at once, on three models
        answers = dict(zip(jobs, pool.map(lambda job: ask(server, *job), jobs)))
    for (variant, prompt), (text, perf) in answers.items():
        assert text == expected[variant][prompt], (variant, prompt)
        assert perf.get("total_draft_tokens", 0) > 0, (variant, perf)  # each speculates with its own method


def test_an_unknown_model_names_the_served_ones(server):
    with pytest.raises(Exception, match="served models: base, base-medusa") as error:
        ask(server, "nope", PROMPTS[0])
    assert "json" in str(error.value)


def test_nvidia_inflight_client_names_a_variants_tensorrt_llm_model(plan, server, tmp_path):
    """NVIDIA's token-level client, unchanged, picks a variant with --model-name <variant>-tensorrt_llm.
    (Its end-to-end client cannot: its --model-name only accepts 'ensemble' and 'tensorrt_llm_bls'.)"""
    variant = next(v for v in plan.variants if v.name == "json")
    tokenizer_dir = variant.stage("package").inputs["tokenizer"]
    client = REPO / "tests" / "data" / "nvidia_clients" / "inflight_batcher_llm_client.py"
    argv = [sys.executable, str(client), "-u", server, "--tokenizer-dir", str(tokenizer_dir), "--text", PROMPTS[0]]
    argv += ["--request-output-len", str(TOKENS), "--streaming", "--model-name", "json-tensorrt_llm"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    match = re.search(r"Output sequence:  \[([0-9, ]*)\]", done.stdout)
    assert match, done.stdout
    ids = [int(i) for i in match.group(1).split(",") if i.strip()]
    text = AutoTokenizer.from_pretrained(tokenizer_dir).decode(ids, skip_special_tokens=True)
    assert text.endswith(plain_answers(variant)[PROMPTS[0]]), text


def test_query_and_bench_address_one_variant(plan, server, cli, tmp_path):
    rc, out, _ = cli("query", PROMPTS[1], "--url", server, "--model", "base-medusa", "--max-tokens", "6", "--perf")
    assert rc == 0 and "mean acceptance length" in out
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    argv = ["bench", "--prompts", str(tmp_path / "prompts.txt"), "--url", server, "--model", "json"]
    # what was served, and this host's GEMMs for that model after the run (for calibrate --gpu cpu)
    repository = next(v for v in plan.variants if v.name == "json").stage("package").output
    rc, out, _ = cli(*argv, "--requests", "2", "--concurrency", "2", "--max-tokens", "6", "--out", str(tmp_path / "b"),
                     "--repository", str(repository), "--probe-host")  # fmt: skip
    report = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert rc == 0 and report["model"] == "json" and report["completed"] == 2
    run = calibrate.read_run(tmp_path / "b")
    assert run.served["method"] == "lookahead" and run.served["arch"]["hidden_size"] == 576
    assert run.host_gemms is not None and run.host_gemms.rows == gemm_probe.PROBE_ROWS
    assert set(run.host_gemms.seconds) == set(gemm_probe.gemm_shapes(ModelGeometry(**run.served["arch"])))
    assert "measuring this host's GEMMs" in out
    # a mix over two variants by name: requests alternate, each variant's figures apart
    mix = [*argv[:-2], "--models", "json,base-medusa", "--requests", "4", "--concurrency", "2", "--max-tokens", "6"]
    mix.append("--ignore-eos")  # every request decodes its 6 tokens
    rc, out, _ = cli(*mix, "--out", str(tmp_path / "m"))
    report = json.loads((tmp_path / "m" / "bench.json").read_text())
    assert rc == 0 and report["models"] == ["json", "base-medusa"] and report["completed"] == 4, out
    per_model = report["per_model"]
    assert {m: per_model[m]["completed"] for m in per_model} == {"json": 2, "base-medusa": 2}
    assert sum(per_model[m]["output_tokens"] for m in per_model) == report["output_tokens"]
    assert sorted({r["model"] for r in report["records"]}) == ["base-medusa", "json"]
    assert [r["tokens"] for r in report["records"]] == [6, 6, 6, 6]
