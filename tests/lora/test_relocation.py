"""A LoRA group's repository and engines moved to another host: no emitted file names the build host's
paths, ``serve --engines-dir`` finds the adapters with the engine, and the reference backend finds them
beside a repository moved together with its engines.

TensorRT-LLM only logs at DEBUG when ``lora_prefetch_dir`` is missing (peftCacheManager.cpp,
``prefetchLoraWeights``), so a stale path would start a server whose every fine-tune fails with
"LoRA task N not found in cache".
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.runtime.triton.io import parse_parameters
from pipeline.spec.document import load_spec
from pipeline.stages import lora as lora_stage
from pipeline.triton import pbtxt
from pipeline.triton.relocate import served_repository
from pipeline.triton.repository import emit_repository
from tests.lora.helpers import make_adapter
from tests.runtime.fixtures import make_hf_model
from tests.triton.triton_fixtures import fake_engine, make_tokenizer

peft = pytest.importorskip("peft")


def built(root: Path, target: str) -> tuple[Path, Path, int]:
    """(the base's packaged repository, the engines root, the fine-tune's task id) under ``root``."""
    from transformers import LlamaForCausalLM

    hf = make_hf_model(root / "hf")
    make_adapter(LlamaForCausalLM.from_pretrained(hf).eval(), root / "qv", 1, r=4, target_modules=["q_proj", "v_proj"])
    spec = root / "spec.yaml"
    dtype = "float32" if target == "reference" else "float16"
    spec.write_text(
        f"name: moved\nmodel: {{path: {hf}, dtype: {dtype}}}\ntarget: {target}\n"
        "build: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}\n"
        "variants:\n  - name: base\n"
        f"  - name: qv\n    model: {{adapter: {root / 'qv'}}}\n    serving: {{lora: shared}}\n"
    )
    plan = make_plan(load_spec(spec), OutputRoots(root / "engines", root / "triton_repo", root / "cache"))
    base = plan.variants[0]
    engine = fake_engine(base, base.stage("build").output)
    adapters = base.stage("lora")
    lora_stage.run(base, adapters, adapters.output)
    package = base.stage("package")
    emit_repository(base, package.output, engine_dir=engine, tokenizer_dir=make_tokenizer(root / "tokenizer"))
    (group,) = plan.lora_groups
    return package.output, engine.parent.parent, group.members[0].task_id


def parameters(repo: Path) -> dict[str, str]:
    return pbtxt.parameters(pbtxt.load(repo / "tensorrt_llm" / "config.pbtxt"))


@pytest.mark.parametrize("target", ["tensorrt", "reference"])
def test_no_emitted_file_names_the_build_hosts_paths(tmp_path, target):
    repo, engines, _ = built(tmp_path / "build", target)
    for path in repo.rglob("*"):
        if path.is_file() and path.suffix in (".pbtxt", ".json"):
            assert str(tmp_path) not in path.read_text(), path
    params = parameters(repo)
    assert params["gpt_model_path"] == "/models/engines/base/engine"
    assert params["lora_prefetch_dir"] == "/models/engines/base/lora"


def test_serve_elsewhere_rewrites_the_adapters_with_the_engine(tmp_path):
    repo, engines, task = built(tmp_path / "build", "tensorrt")
    moved = tmp_path / "volume"
    shutil.move(engines, moved / "engines")
    shutil.move(repo.parent, moved / "triton_repo")
    served = served_repository(moved / "triton_repo" / repo.name, moved / "engines", tmp_path / "scratch")
    params = parameters(served)
    assert params["gpt_model_path"] == str((moved / "engines" / "base" / "engine").resolve())
    assert params["lora_prefetch_dir"] == str((moved / "engines" / "base" / "lora").resolve())
    assert (Path(params["lora_prefetch_dir"]) / str(task) / "model.lora_weights.npy").is_file()


def test_the_reference_backend_finds_adapters_moved_with_their_repository(tmp_path):
    repo, engines, task = built(tmp_path / "build", "reference")
    moved = tmp_path / "elsewhere"
    shutil.move(tmp_path / "build", moved)  # engines and repository together
    model_dir = moved / repo.relative_to(tmp_path / "build") / "tensorrt_llm"
    config = {"parameters": {k: {"string_value": v} for k, v in parameters(model_dir.parent).items()}}
    found = parse_parameters(config, model_dir).lora_prefetch_dir
    assert found is not None and (found / str(task) / "model.lora_weights.npy").is_file()
    assert found.resolve() == (moved / "engines" / "base" / "lora").resolve()
