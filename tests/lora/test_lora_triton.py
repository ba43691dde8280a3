"""A LoRA group through a real tritonserver: SmolLM2 with both shipped adapters (adapters/) shared on one
engine built with the LoRA plugin, the adapters prefetched from the lora stage's folder
(``lora_prefetch_dir``).

Correct answers come from outside Triton: each fine-tune's merged engine (the merge stage's output,
converted and built like any variant) decoded greedily by the reference runtime. Requests for the
base and both fine-tunes are in flight together; NVIDIA's inflight client, unchanged, addresses a
fine-tune by its task id alone (prefetched) and by sending the adapter with a new task id
(``--lora-path`` pointed at the lora stage's folder, as NVIDIA's instructions say), which the base
allows (``serving.lora_client_adapters``) and the fine-tunes' own models refuse. ``code`` has the
default Python ensemble, which sets its task id itself; ``json`` Triton's ensemble, whose
preprocessing of its own sets it.
"""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from transformers import AutoTokenizer

from pipeline.client import GenerationRequest, TritonClient, build_inputs
from pipeline.client.stream import ClientError
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots, Plan
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.request import GenerationRequest as RuntimeRequest
from pipeline.runtime.spec_decode.base import PlainDecoding
from pipeline.spec.document import load_spec
from pipeline.stages.execute import execute_plan, execute_spec_repository
from pipeline.triton.launch_cpu import reference_backend_available
from pipeline.triton.repository import MANIFEST
from tests.conftest import embedded_cache_dir
from tests.runtime.drive import decode

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.slow,
    pytest.mark.smollm2,
    pytest.mark.skipif(not reference_backend_available(), reason="the reference backend is not in this checkout"),
]
REPO = Path(__file__).resolve().parents[2]
PROMPTS = ("def fibonacci(n):", "Name three colors.")
TOKENS = 10
SPEC = f"""
name: lora-group
model: {{builtin: smollm2-135m-instruct, dtype: float32}}
build: {{max_batch_size: 8, max_input_len: 128, max_seq_len: 256, max_num_tokens: 512}}
target: reference
variants:
  - name: base
    serving: {{lora_client_adapters: true}}  # NVIDIA's client sends an adapter of its own below
  - name: code
    model: {{adapter: {REPO / "adapters" / "smollm2-code"}}}
    serving: {{lora: shared}}
  - name: json
    model: {{adapter: {REPO / "adapters" / "smollm2-json"}}}
    serving: {{lora: shared, ensemble: triton}}
"""


MERGED = f"""
name: merged
model: {{builtin: smollm2-135m-instruct, dtype: float32}}
build: {{max_batch_size: 8, max_input_len: 128, max_seq_len: 256, max_num_tokens: 512}}
target: reference
variants:
  - name: code
    model: {{adapter: {REPO / "adapters" / "smollm2-code"}}}
    serving: {{lora: merged}}
  - name: json
    model: {{adapter: {REPO / "adapters" / "smollm2-json"}}}
    serving: {{lora: merged}}
"""


def built(root: Path, text: str) -> Plan:
    root.mkdir(parents=True)
    (root / "spec.yaml").write_text(textwrap.dedent(text).lstrip())
    plan = make_plan(
        load_spec(root / "spec.yaml"), OutputRoots(root / "engines", root / "triton_repo", embedded_cache_dir())
    )
    outcomes = execute_plan(plan, say=lambda _: None)
    assert all(o.stopped_at is None and o.exit_code == 0 for o in outcomes), outcomes
    return plan


@pytest.fixture(scope="module")
def plan(module_tmp) -> Plan:
    plan = built(module_tmp("lora-group") / "shared", SPEC)
    assert execute_spec_repository(plan, {v.name for v in plan.variants}, say=lambda _: None) is not None
    return plan


@pytest.fixture(scope="module")
def expected(plan, module_tmp) -> dict[tuple[str, str], list[int]]:
    """(variant, prompt) -> greedy ids without Triton: each fine-tune's merged engine, and the base on the
    group's engine without an adapter."""
    root = module_tmp("lora-merged")
    merged = built(root / "merged", MERGED)
    tokenizer = tokenizer_of(merged)
    out = {}
    for variant in (plan.variants[0], *merged.variants):
        engine = Engine.load(variant.stage("build").output)
        requests = [
            RuntimeRequest(
                p, tuple(tokenizer.encode(p)), TOKENS, end_id=tokenizer.eos_token_id, exclude_input_in_output=True
            )
            for p in PROMPTS
        ]
        outputs = decode(engine, PlainDecoding(), requests, in_flight=2)
        out.update({(variant.name, p): outputs[p].tokens for p in PROMPTS})
    shutil.rmtree(root)  # two fp32 copies of the model, each merged, converted and built: 3 GB the server does not need
    return out


def tokenizer_of(plan):
    return AutoTokenizer.from_pretrained(plan.variants[0].stage("package").inputs["tokenizer"])


@pytest.fixture(scope="module")
def server(plan, module_tmp):
    from tests.triton.triton_fixtures import serve_repository

    assert plan.repository is not None
    repo = plan.repository.output  # every variant by its own name; one tensorrt_llm model for the group
    running = serve_repository(
        repo,
        module_tmp("logs") / "server.log",
        models=("base", "code", "json", "base-tensorrt_llm"),
        ready_timeout=300,
    )
    try:
        yield running
    finally:
        running.stop()


def task_of(plan, name: str) -> int:
    (group,) = plan.lora_groups
    return next(m.task_id for m in group.members if m.variant == name)


def ask(url: str, prompt: str, task: int | None, model: str = "base") -> str:
    extra = []
    if task is not None:
        tensor = grpcclient.InferInput("lora_task_id", [1, 1], "UINT64")
        tensor.set_data_from_numpy(np.array([[task]], np.uint64))
        extra.append(tensor)
    try:
        with TritonClient(url, model) as client:
            return client.generate_raw(
                build_inputs(GenerationRequest(prompt, max_tokens=TOKENS)) + extra, timeout=300
            ).text
    except ClientError as exc:
        return f"error: {exc}"


def test_base_and_fine_tunes_in_flight_together_equal_their_merged_engines(plan, expected, server):
    """Each fine-tune by its own model name (which sets its task id) and through the base's ensemble
    with its lora_task_id, all in flight together on the group's one engine."""
    tokenizer = tokenizer_of(plan)
    jobs = [
        (name, prompt, how)
        for prompt in PROMPTS
        for name, how in [
            ("base", "name"),
            ("code", "name"),
            ("json", "name"),
            ("code", "task id"),
            ("json", "task id"),
        ]
    ]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {}
        for job in jobs:
            name, prompt, how = job
            model, task = (name, None) if how == "name" else ("base", task_of(plan, name))
            futures[job] = pool.submit(ask, server.grpc_url, prompt, task, model)
        answers = {job: future.result() for job, future in futures.items()}
    for (name, prompt, how), text in answers.items():
        want = tokenizer.decode(expected[name, prompt], skip_special_tokens=True)
        assert text.strip() == want.strip(), (name, prompt, how)
    answers = {(name, prompt): text for (name, prompt, _), text in answers.items()}
    assert any(answers["code", p] != answers["base", p] for p in PROMPTS)  # the adapter changes the text
    assert plan.repository is not None
    served = json.loads((plan.repository.output / MANIFEST).read_text())["variants"]
    pre = {entry["variant"]: entry["models"]["preprocessing"] for entry in served}
    assert pre["code"] == pre["base"]  # the Python ensemble sets the task id: the group shares preprocessing
    assert pre["json"] == "json-preprocessing"  # Triton's ensemble: the fine-tune's own preprocessing sets it
    (group,) = plan.lora_groups
    assert group.base_variant == "base" and {m.variant for m in group.members} == {"code", "json"}
    # One engine: the fine-tunes' plans are the group engine's stages (no merge) and a package of their own.
    engines = {v.name: v.stage("build").output for v in plan.variants}
    assert engines["code"] == engines["json"] == engines["base"]
    assert not any(s.name == "merge" for v in plan.variants for s in v.stages)


def test_unknown_task_id_gets_tensorrt_llms_error(server):
    message = ask(server.grpc_url, PROMPTS[0], 12345)
    assert "LoRA task 12345 not found in cache. Please send LoRA weights with request" in message


@pytest.mark.parametrize("model", ["code", "json"])  # the Python ensemble and Triton's
def test_a_fine_tunes_models_refuse_a_clients_adapter_at_triton(server, model):
    """A fine-tune's models withhold lora_weights/lora_config: Triton itself refuses them, as on a GPU."""
    weights = grpcclient.InferInput("lora_weights", [1, 1, 8], "FP32")
    weights.set_data_from_numpy(np.zeros((1, 1, 8), np.float32))
    config = grpcclient.InferInput("lora_config", [1, 1, 3], "INT32")
    config.set_data_from_numpy(np.zeros((1, 1, 3), np.int32))
    with TritonClient(server.grpc_url, model) as client:
        with pytest.raises(ClientError, match="unexpected inference input 'lora_(weights|config)' for model"):
            client.generate_raw(
                build_inputs(GenerationRequest(PROMPTS[0], max_tokens=TOKENS)) + [weights, config], timeout=300
            )
    assert "error" not in ask(server.grpc_url, PROMPTS[0], None, model)  # and it serves the next one


def test_nvidia_inflight_client_with_task_id_and_lora_path(plan, expected, server, tmp_path):
    from tests.triton.triton_fixtures import NVIDIA_CLIENTS, run_client

    repo = plan.variants[0].stage("package").output
    prompt_ids = tokenizer_of(plan).encode(PROMPTS[0])

    def inflight(*flags: str) -> list[int]:
        done = run_client(
            NVIDIA_CLIENTS / "inflight_batcher_llm_client.py",
            server.grpc_url,
            "--tokenizer-dir",
            str(repo / "preprocessing" / "tokenizer"),
            "--text",
            PROMPTS[0],
            "--request-output-len",
            str(TOKENS),
            "--streaming",
            "--model-name",
            "base-tensorrt_llm",
            *flags,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        match = re.search(r"Output sequence:  \[([0-9, ]*)\]", done.stdout)
        assert match, done.stdout
        ids = [int(i) for i in match.group(1).split(",") if i.strip()]
        return ids[len(prompt_ids) :]  # in streaming the client prepends the prompt itself

    want = expected["code", PROMPTS[0]]
    task = task_of(plan, "code")
    assert inflight("--lora-task-id", str(task)) == want  # prefetched: the id alone
    # NVIDIA's LoRA instructions with our output, unchanged: the lora stage's folder of the fine-tune,
    # sent with a new task id (its files are in the dtype the repository declares for lora_weights).
    folder = plan.variants[0].stage("lora").output / str(task)
    assert inflight("--lora-path", str(folder), "--lora-task-id", str(task)) == want  # as NVIDIA's docs do it
    assert inflight("--lora-path", str(folder), "--lora-task-id", "77") == want  # a new id: a client adapter
    assert inflight("--lora-task-id", "77") == want  # and cached under that id from then on
