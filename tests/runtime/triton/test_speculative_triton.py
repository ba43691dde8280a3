"""Speculative decoding through the Triton adapter (fake triton_python_backend_utils, no server):
the shipped parameters select the method, per-request lookahead inputs are checked, acceptance comes
back in the perf-metric outputs and as Prometheus counters with a per-position label."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline import trees
from pipeline.errors import InputError
from pipeline.runtime.spec_decode.base import PlainDecoding
from pipeline.runtime.triton import backend as triton_backend
from pipeline.runtime.triton.io import parse_parameters, parse_request
from tests.runtime.drive import SPEC_PROMPTS as PROMPTS
from tests.runtime.drive import decode, requests
from tests.runtime.fixtures import TREE
from tests.runtime.triton.fakes import FakeMetric, FakeRequest, fake_pb_utils, inputs, model_config


class LabelledFamily:
    """MetricFamily that keeps one metric per (name, labels)."""

    COUNTER, GAUGE = "counter", "gauge"
    made: dict[tuple[str, tuple[tuple[str, str], ...]], FakeMetric] = {}

    def __init__(self, name, description, kind):
        self.name = name

    def Metric(self, labels):
        return LabelledFamily.made.setdefault((self.name, tuple(sorted(labels.items()))), FakeMetric())

    @classmethod
    def value(cls, name: str, **labels: str) -> float:
        return sum(m.value for (n, lbl), m in cls.made.items() if n == name and labels.items() <= dict(lbl).items())


@pytest.fixture
def serve(monkeypatch):
    models = []

    def start(engine_dir: Path, **params: str):
        pb = fake_pb_utils()
        pb.MetricFamily = LabelledFamily
        monkeypatch.setattr(triton_backend, "pb_utils", pb)
        LabelledFamily.made = {}
        model = triton_backend.TritonPythonModel()
        model.initialize(
            {
                "model_config": json.dumps(model_config(engine_dir, **params)),
                "model_name": "tensorrt_llm",
                "model_version": "1",
                "model_repository": str(engine_dir.parent),
            }
        )
        models.append(model)
        return model

    yield start
    for model in models:
        model.finalize()


def plain(engine) -> dict[str, list[int]]:
    return {rid: out.tokens for rid, out in decode(engine, PlainDecoding(), requests(PROMPTS[:4], 12), 4).items()}


def ask(model, rid: str, prompt: list[int], n: int = 12, **extra) -> FakeRequest:
    request = FakeRequest(rid, **inputs(prompt, n, return_perf_metrics=np.array([True]), **extra))
    model.execute([request])
    return request


@pytest.mark.parametrize(
    "kind,params",
    [
        ("medusa", {"decoding_mode": "medusa", "medusa_choices": trees.to_triton_choices(TREE)}),
        ("eagle", {"decoding_mode": "eagle", "eagle_choices": trees.to_triton_choices(TREE)}),
        (
            "eagle",
            {
                "decoding_mode": "eagle",
                "reference_eagle_use_dynamic_tree": "true",
                "reference_eagle_dynamic_tree_max_top_k": "3",
            },
        ),
        (
            "lookahead",
            {
                "decoding_mode": "lookahead",
                "lookahead_window_size": "4",
                "lookahead_ngram_size": "3",
                "lookahead_verification_set_size": "4",
            },
        ),
    ],
)
def test_methods_from_the_shipped_parameters(spec_engines, serve, kind, params):
    engine = spec_engines(kind)
    model = serve(engine.config.folder, **params)
    assert model.scheduler.method.name == kind
    sent = [ask(model, str(i), p) for i, p in enumerate(PROMPTS[:4])]
    want = plain(engine)
    drafted = accepted = 0
    for request in sent:
        (response,) = request.sender.responses()
        t = response.tensors
        assert t["output_ids"][0, 0].tolist() == want[request.rid]
        draft, acc = int(t["total_draft_tokens"][0, 0]), int(t["total_accepted_draft_tokens"][0, 0])
        assert t["acceptance_rate"][0, 0] == pytest.approx(acc / draft if draft else 0.0)
        drafted, accepted = drafted + draft, accepted + acc
    assert drafted > accepted > 0
    # Prometheus: counters per server, per-position acceptance with a "position" label. The scheduler
    # thread counts a step after answering it: wait for the last one.
    prefix = "specdeploy_reference_spec_decode"
    deadline = time.monotonic() + 30
    while LabelledFamily.value(f"{prefix}_num_draft_tokens_total") < drafted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert LabelledFamily.value(f"{prefix}_num_draft_tokens_total") == drafted
    assert LabelledFamily.value(f"{prefix}_num_accepted_tokens_total") == accepted
    steps = LabelledFamily.value(f"{prefix}_num_drafts_total")
    per_pos = [
        LabelledFamily.value(f"{prefix}_num_accepted_tokens_per_pos_total", position=str(k))
        for k in range(model.scheduler.method.draft_positions)
    ]
    assert sum(per_pos) == accepted and per_pos[0] >= per_pos[-1] and 0 < steps <= 4 * 12
    assert (
        LabelledFamily.value(f"{prefix}_num_accepted_tokens_per_pos_total", model="tensorrt_llm", position="0")
        == per_pos[0]
    )


def test_per_request_lookahead_inputs(spec_engines, serve):
    engine = spec_engines("lookahead")
    model = serve(
        engine.config.folder,
        decoding_mode="lookahead",
        lookahead_window_size="4",
        lookahead_ngram_size="3",
        lookahead_verification_set_size="4",
    )
    want = plain(engine)

    def look(w: int, n: int, g: int) -> dict[str, np.ndarray]:
        return {
            "lookahead_window_size": np.array([w], np.int32),
            "lookahead_ngram_size": np.array([n], np.int32),
            "lookahead_verification_set_size": np.array([g], np.int32),
        }

    small = ask(model, "0", PROMPTS[0], **look(2, 2, 1))
    plain_step = ask(model, "1", PROMPTS[1], **look(1, 1, 0))
    too_big = ask(model, "2", PROMPTS[2], **look(4, 4, 4))
    partial = ask(model, "3", PROMPTS[3], lookahead_window_size=np.array([2], np.int32))
    assert small.sender.responses()[0].tensors["output_ids"][0, 0].tolist() == want["0"]
    (response,) = plain_step.sender.responses()
    assert response.tensors["output_ids"][0, 0].tolist() == want["1"]
    assert response.tensors["total_draft_tokens"][0, 0] == 0
    assert "exceeds the server's (W, N, G) = (4, 3, 4)" in too_big.sender.responses()[0].error
    assert "all three" in partial.sender.responses()[0].error


def test_lookahead_inputs_need_a_lookahead_model(spec_engines, serve):
    model = serve(
        spec_engines("medusa").config.folder, decoding_mode="medusa", medusa_choices=trees.to_triton_choices(TREE)
    )
    request = ask(
        model,
        "x",
        PROMPTS[0],
        lookahead_window_size=np.array([2], np.int32),
        lookahead_ngram_size=np.array([2], np.int32),
        lookahead_verification_set_size=np.array([1], np.int32),
    )
    assert "only allowed when the model sets the lookahead parameters" in request.sender.responses()[0].error


def test_reference_parameters_and_load_errors(spec_engines, tmp_path):
    params = parse_parameters(
        model_config(
            Path("e"),
            decoding_mode="eagle",
            reference_eagle_use_dynamic_tree="true",
            reference_eagle_dynamic_tree_max_top_k="4",
        ),
        tmp_path,
    )
    settings = params.method
    assert settings.eagle_dynamic_tree and settings.eagle_dynamic_tree_max_top_k == 4
    assert settings.decoding_mode == "eagle" and settings.eagle_choices is None
    got = parse_request(
        lambda n: inputs([1, 2], 3).get(n),
        "r",
        parse_parameters(
            model_config(
                Path("e"),
                decoding_mode="lookahead",
                lookahead_window_size="4",
                lookahead_ngram_size="3",
                lookahead_verification_set_size="4",
            )
        ),
    )
    assert got.lookahead is None  # no per-request inputs: the server's (W, N, G)
    with pytest.raises(InputError, match="built without lookahead"):
        triton_backend.TritonPythonModel().initialize(
            {
                "model_config": json.dumps(
                    model_config(
                        spec_engines(None).config.folder,
                        decoding_mode="lookahead",
                        lookahead_window_size="4",
                        lookahead_ngram_size="3",
                        lookahead_verification_set_size="4",
                    )
                )
            }
        )


@pytest.mark.slow
@pytest.mark.tritonserver
def test_speculative_metrics_in_a_real_tritonserver(spec_engines, tmp_path):
    """The per-position series (an extra ``position`` label on one family) is accepted by Triton's
    custom-metrics API and served on the metrics port; acceptance comes back over gRPC."""
    import urllib.request

    from pipeline.triton import pbtxt
    from pipeline.triton.configs import RepositorySettings, tensorrt_llm_config
    from pipeline.triton.launch_cpu import CpuServerConfig, CpuTritonServer
    from tests.conftest import REPO as REPO_ROOT
    from tests.runtime.triton.grpc_stream import stream
    from tests.servers import free_ports

    params = {
        "gpt_model_path": str(spec_engines("medusa").config.folder),
        "exclude_input_in_output": "true",
        "decoding_mode": "medusa",
        "medusa_choices": trees.to_triton_choices(TREE),
        "reference_num_threads": "1",
    }
    (tmp_path / "repo" / "tensorrt_llm" / "1").mkdir(parents=True)
    pbtxt.write(
        tensorrt_llm_config(RepositorySettings("ensemble", 8, True, False, 1, 1, 0, {}, {}, params)),
        tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt",
    )
    http, grpc, metrics = free_ports(3)
    config = CpuServerConfig(
        repositories=(tmp_path / "repo",),
        cache_dir=REPO_ROOT / ".cache",
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        ready_timeout=180,
        models=("tensorrt_llm",),
        log_file=tmp_path / "tritonserver.log",
    )
    with CpuTritonServer(config) as server:
        got = stream(server, {str(i): (p, 12, {}) for i, p in enumerate(PROMPTS[:4])})
        want = plain(spec_engines("medusa"))
        assert {rid: pieces[0][0, 0].tolist() for rid, pieces in got.items()} == want
        url = f"http://127.0.0.1:{metrics}/metrics"
        deadline, text = time.monotonic() + 30, ""
        while time.monotonic() < deadline and 'position="0"' not in text:
            text = urllib.request.urlopen(url, timeout=10).read().decode()
            time.sleep(0.2)
    lines = {line.split()[0]: float(line.split()[-1]) for line in text.splitlines() if line.startswith("specdeploy")}
    prefix = "specdeploy_reference_spec_decode"
    drafts = next(v for k, v in lines.items() if k.startswith(f"{prefix}_num_draft_tokens_total"))
    accepted = next(v for k, v in lines.items() if k.startswith(f"{prefix}_num_accepted_tokens_total"))
    per_pos = [v for k, v in lines.items() if k.startswith(f"{prefix}_num_accepted_tokens_per_pos_total")]
    assert drafts > accepted > 0 and len(per_pos) == 3 and sum(per_pos) == accepted
