"""Helpers for the Triton tests: a tiny offline tokenizer, tiny specs, fake engines, free ports.

(A uniquely named module, not conftest.py: test modules import these functions directly.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import SpecdeployError
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots, Plan, VariantPlan
from pipeline.spec.document import load_spec
from pipeline.stages.execute import stage_body
from pipeline.stages.runner import run_stage
from pipeline.triton.launch_cpu import CpuServerConfig, CpuTritonServer
from tests.conftest import TINY_LLAMA_CONFIG, engine_specs
from tests.servers import free_ports

WORDS = ["a", "hello", "world", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "stop"]
WORDS += [f"w{i}" for i in range(200)]
SPECIALS = ["<unk>", "<pad>", "</s>"]


def make_tokenizer(folder: Path) -> Path:
    """A word-level Hugging Face tokenizer built offline with `tokenizers` (no hub)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIALS + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    return folder


def make_model_dir(folder: Path, **overrides) -> Path:
    """config.json of a tiny Llama (enough to plan) plus the tiny tokenizer."""
    # the tiny tokenizer's vocabulary and special tokens
    config = TINY_LLAMA_CONFIG | {"vocab_size": 256, "eos_token_id": 2, "pad_token_id": 1, "bos_token_id": 2}
    config.update(overrides)
    make_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


TINY_SPEC = """
name: tiny
model:
  path: model
  dtype: float32
speculative:
  method: lookahead
  lookahead: {window: 3, ngram: 2, verification_set: 2}
build:
  max_batch_size: 8
  max_input_len: 32
  max_seq_len: 160
  max_num_tokens: 256
target: reference
"""


def triton_specs() -> list[Path]:
    """The shipped specs served through a Triton repository: those whose targets build engines."""
    return engine_specs()


def plan_spec(path: Path, roots_dir: Path) -> Plan:
    return make_plan(
        load_spec(path), OutputRoots(roots_dir / "engines", roots_dir / "triton_repo", roots_dir / "cache")
    )


def tiny_plan(folder: Path, spec_text: str = TINY_SPEC) -> VariantPlan:
    make_model_dir(folder / "model")
    spec = folder / "spec.yaml"
    spec.write_text(textwrap.dedent(spec_text).lstrip())
    return plan_spec(spec, folder).variants[0]


def fake_engine(variant: VariantPlan, folder: Path | None = None) -> Path:
    """An engine folder whose config.json says what the plan asked for (no weights)."""
    folder = folder or variant.stage("build").output
    folder.mkdir(parents=True, exist_ok=True)
    build = variant.build
    config = {
        "version": "1.2.1",
        "pretrained_config": {
            "architecture": variant.arch.architecture,
            "mapping": {"tp_size": variant.tp, "pp_size": variant.pp, "world_size": variant.world_size},
        },
        "build_config": {
            "max_batch_size": build.max_batch_size,
            "max_input_len": build.max_input_len,
            "max_seq_len": build.engine_max_seq_len,
            "max_num_tokens": build.engine_max_num_tokens,
            "max_draft_len": build.max_draft_len,
            "speculative_decoding_mode": build.speculative_decoding_mode,
        },
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def tiny_llama(folder: Path, max_position_embeddings: int = 256) -> Path:
    """Random weights, scaled so greedy decoding has no near-ties; the vocabulary is the tokenizer's."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(SPECIALS) + len(WORDS),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=max_position_embeddings,
        initializer_range=0.15,
        tie_word_embeddings=False,
        eos_token_id=2,
        pad_token_id=1,
        bos_token_id=2,
    )
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    make_tokenizer(folder)
    return folder


def build_with_stages(variant: VariantPlan) -> Path:
    for stage in variant.stages:
        body = stage_body(stage.name)
        run_stage(stage, lambda out, body=body, stage=stage: body(variant, stage, out), on_wait=print)
    return variant.stage("package").output


def start_server(make_config: Callable[[int, int, int], CpuServerConfig], attempts: int = 3) -> CpuTritonServer:
    """Start on free (http, grpc, metrics) ports; other processes on this host may take a port between
    our pick and the server's bind, so a port clash is retried with new ports."""
    for attempt in range(attempts):
        server = CpuTritonServer(make_config(*free_ports(3)))
        try:
            return server.start()
        except SpecdeployError as exc:
            if "in use" not in str(exc) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


STANDIN_BACKEND = Path(__file__).with_name("standin_backend.py")
# NVIDIA's client programs, kept unchanged as test inputs (tests/data/nvidia_clients/README.md).
NVIDIA_CLIENTS = Path(__file__).resolve().parents[1] / "data" / "nvidia_clients"


def run_client(script: Path, url: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A client program exactly as a user runs it: its own process, from a directory of its own."""
    done = subprocess.run(
        [sys.executable, str(script), "-u", url, *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    print(done.stdout[-4000:], done.stderr[-4000:])
    return done


def serve_repository(
    repo: Path, log_file: Path, models: tuple[str, ...] = ("ensemble",), ready_timeout: float = 240, **options: Any
) -> CpuTritonServer:
    """A real tritonserver serving ``repo`` with the reference backend (or ``backend_model=``), on
    free ports; ready when ``models`` are (``repositories=`` serves several folders instead)."""
    from tests.conftest import REPO

    def config(http: int, grpc: int, metrics: int) -> CpuServerConfig:
        settings: dict[str, Any] = {"repositories": (repo,), "cache_dir": REPO / ".cache", **options}
        return CpuServerConfig(
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            ready_timeout=ready_timeout,
            models=models,
            log_file=log_file,
            **settings,
        )

    return start_server(config)


def start_standin_server(repo: Path, log_file: Path, **options: Any) -> CpuTritonServer:
    """A real tritonserver serving ``repo``'s ensemble, with the stand-in ``tensorrtllm`` backend."""
    return serve_repository(repo, log_file, ready_timeout=180, backend_model=STANDIN_BACKEND, **options)


def reference_metric(server: CpuTritonServer, name: str) -> dict[str, float]:
    """One of the reference backend's metrics (pipeline/runtime/serving/metrics.py) per tensorrt_llm
    model, from Triton's metrics port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.config.metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = re.findall(rf'{name}\{{model="([^"]+)"[^}}]*\}} (\S+)', text)
    return {model: float(value) for model, value in found}


def in_flight(server: CpuTritonServer) -> dict[str, float]:
    """specdeploy_reference_requests_in_flight per tensorrt_llm model."""
    return reference_metric(server, "specdeploy_reference_requests_in_flight")


def wait_until_idle(server: CpuTritonServer, deadline_s: float = 120.0) -> dict[str, float]:
    """Wait until no tensorrt_llm model has a request in flight (an abandoned or cancelled one leaves at
    its next step, later on a loaded host); the gauges last seen (all zero unless the deadline passed)."""
    deadline = time.monotonic() + deadline_s
    while True:
        seen = in_flight(server)
        if not any(seen.values()) or time.monotonic() >= deadline:
            return seen
        time.sleep(0.05)
