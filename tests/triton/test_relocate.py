"""A packaged repository moved away from its engines (pipeline/triton/relocate.py), and the CPU
reference backend's own fallback for a repository moved together with them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from triton_fixtures import TINY_SPEC, fake_engine, tiny_plan

from pipeline.errors import InputError
from pipeline.runtime.triton.io import parse_parameters
from pipeline.triton import pbtxt
from pipeline.triton.relocate import served_repository
from pipeline.triton.repository import emit_repository

GPU_SPEC = TINY_SPEC.replace("target: reference", "target: tensorrt")


def packaged(tmp_path: Path, spec: str = GPU_SPEC) -> tuple[Path, Path]:
    """(the repository, the engines root) of a tiny variant with a fake engine."""
    variant = tiny_plan(tmp_path, spec)
    engine = fake_engine(variant)
    repo = variant.stage("package").output
    emit_repository(variant, repo, engine_dir=engine, tokenizer_dir=variant.model_dir)
    return repo, engine.parent.parent


def gpt_model_path(repo: Path) -> str:
    return pbtxt.parameters(pbtxt.load(repo / "tensorrt_llm" / "config.pbtxt"))["gpt_model_path"]


def test_a_moved_repository_is_served_as_a_copy_naming_the_engines_dir(tmp_path):
    repo, engines = packaged(tmp_path / "build")
    moved = tmp_path / "volume"
    shutil.move(engines, moved / "engines")
    shutil.move(repo.parent, moved / "triton_repo")
    repo, engines = moved / "triton_repo" / repo.name, moved / "engines"
    original = (repo / "tensorrt_llm" / "config.pbtxt").read_text()

    served = served_repository(repo, engines, tmp_path / "scratch")
    assert served.parent == tmp_path / "scratch" and served != repo
    assert gpt_model_path(served) == str((engines / "tiny" / "engine").resolve())
    assert gpt_model_path(repo) == "/models/engines/tiny/engine"  # the packaged file is untouched
    assert (repo / "tensorrt_llm" / "config.pbtxt").read_text() == original
    # Everything else is the same files (hard links), so the copy costs next to nothing.
    model_py = Path("preprocessing") / "1" / "model.py"
    assert (served / model_py).stat().st_ino == (repo / model_py).stat().st_ino
    assert json.loads((served / "specdeploy-repository.json").read_text())["variant"] == "tiny"
    assert sorted(p.name for p in tmp_path.joinpath("scratch").iterdir()) == [served.name]  # no temp left


def test_engines_where_the_repository_names_them_need_no_copy(tmp_path):
    spec = GPU_SPEC + f"deploy: {{mount_path: {tmp_path}}}\n"  # the build's root is the mount path
    repo, _ = packaged(tmp_path, spec)
    assert gpt_model_path(repo) == str(tmp_path / "engines" / "tiny" / "engine")
    assert served_repository(repo, tmp_path / "nowhere", tmp_path / "scratch") == repo
    assert not (tmp_path / "scratch").exists()


def test_engines_in_neither_place_are_named_with_what_to_do(tmp_path):
    repo, engines = packaged(tmp_path)
    shutil.rmtree(engines)
    with pytest.raises(InputError) as error:
        served_repository(repo, engines, tmp_path / "scratch")
    message = str(error.value)
    assert "tensorrt_llm/config.pbtxt: gpt_model_path /models/engines/tiny/engine holds no engine" in message
    assert str(engines / "tiny" / "engine") in message and "--engines-dir" in message


def test_reference_backend_finds_an_engine_moved_together_with_its_repository(tmp_path):
    repo, engines = packaged(tmp_path / "build", TINY_SPEC)
    moved = tmp_path / "volume"
    shutil.move(tmp_path / "build", moved)
    model = moved / "triton_repo" / repo.name / "tensorrt_llm"
    config = pbtxt.load(model / "config.pbtxt")
    as_json = {"parameters": {k: {"string_value": v} for k, v in pbtxt.parameters(config).items()}}
    params = parse_parameters(as_json, model)
    assert params.engine_dir.resolve() == (moved / "engines" / "tiny" / "engine").resolve()


def test_a_reference_repository_moved_with_its_engines_needs_no_copy(tmp_path):
    repo, _ = packaged(tmp_path / "build", TINY_SPEC)
    shutil.move(tmp_path / "build", tmp_path / "volume")
    repo = tmp_path / "volume" / "triton_repo" / repo.name
    assert served_repository(repo, tmp_path / "nowhere", tmp_path / "scratch") == repo
