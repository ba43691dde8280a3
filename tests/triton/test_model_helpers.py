"""The Python models' helper modules (repository.MODEL_HELPERS): copied beside each model.py that imports
them, found the way Triton's Python backend finds them (the version folder on ``sys.path``), and held
to this specdeploy's copy by stale_models. The server tests (test_server_*.py) load them in a real
tritonserver."""

from __future__ import annotations

import json
import py_compile
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from google.protobuf import json_format, text_format
from triton_fixtures import fake_engine, tiny_plan
from tritonclient.grpc import model_config_pb2

from pipeline.triton.repository import MODEL_HELPERS, MODELS_SOURCE, emit_repository, stale_models

HELPER = "specdeploy_tokenizer.py"

# Triton's Python backend stub: the version folder and the model folder go on sys.path, then it imports
# ``1.model`` and calls initialize with the config as JSON (proto field names) and the model's folder.
LOAD_AS_TRITON = textwrap.dedent(
    """
    import importlib, json, sys, types

    model_dir, config = sys.argv[1], sys.argv[2]
    sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
    sys.path.append(model_dir + "/1")
    sys.path.append(model_dir)
    model = importlib.import_module("1.model").TritonPythonModel()
    model.initialize({"model_config": config, "model_repository": model_dir})
    tokenizer = model.tokenizer
    ids = tokenizer.encode("hello world", add_special_tokens=False)
    piece = model.decode_piece(ids) if hasattr(model, "decode_piece") else None
    print(json.dumps({"pad": tokenizer.pad_token_id, "piece": piece, "pipeline": "pipeline" in sys.modules}))
    """
)


@pytest.fixture
def repo(tmp_path) -> Path:
    variant = tiny_plan(tmp_path)
    out = tmp_path / "repo"
    emit_repository(variant, out, engine_dir=fake_engine(variant), tokenizer_dir=variant.model_dir)
    return out


def test_helpers_compile():
    for helpers in MODEL_HELPERS.values():
        for helper in helpers:
            py_compile.compile(str(MODELS_SOURCE / helper), doraise=True)


def test_each_model_gets_the_helpers_it_imports(repo):
    assert set(MODEL_HELPERS) == {"preprocessing", "postprocessing"}
    for name in ("preprocessing", "postprocessing"):
        assert f"from {HELPER.removesuffix('.py')} import" in (repo / name / "1" / "model.py").read_text()
        assert (repo / name / "1" / HELPER).read_bytes() == (MODELS_SOURCE / HELPER).read_bytes()
    assert sorted(p.name for p in (repo / "tensorrt_llm_bls" / "1").iterdir()) == ["model.py"]
    assert stale_models(repo) == []


def test_a_changed_or_missing_helper_is_stale(repo):
    (repo / "preprocessing" / "1" / HELPER).write_text("# another specdeploy's\n")
    (repo / "postprocessing" / "1" / HELPER).unlink()
    assert stale_models(repo) == ["preprocessing", "postprocessing"]


@pytest.mark.parametrize("name", ["preprocessing", "postprocessing"])
def test_the_packaged_model_loads_its_helper_as_triton_does(repo, name, tmp_path):
    config = model_config_pb2.ModelConfig()
    text_format.Parse((repo / name / "config.pbtxt").read_text(), config)
    as_json = json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))
    run = subprocess.run(
        [sys.executable, "-c", LOAD_AS_TRITON, str(repo / name), as_json],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert loaded["pad"] is not None and not loaded["pipeline"]  # the models never import specdeploy
    if name == "postprocessing":
        assert loaded["piece"].split() == ["hello", "world"]
