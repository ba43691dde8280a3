"""The release manifest (engines/<spec>/manifest.json), `specdeploy verify`, the sha256 cache
and `engine --hash-inputs`, on a tiny model built locally (reference target)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from pipeline.io import hashing
from pipeline.io.hashing import HashCache
from tests.quantize.conftest import build_tiny_llama

LIMITS = "build: {max_batch_size: 2, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}\n"


@pytest.fixture
def tiny_spec(tmp_path):
    model = build_tiny_llama(tmp_path / "model")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        f"name: tiny\nmodel: {{path: {model}, dtype: float32}}\n{LIMITS}target: reference\nparallel: {{tp: 2}}\n"
    )
    return spec, model


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_engine_writes_the_manifest_and_verify_names_changed_and_missing_files(cli, tiny_spec, tmp_path):
    spec, model = tiny_spec
    rc, out, err = cli("engine", str(spec))
    assert rc == 0, err
    manifest = tmp_path / "engines" / "tiny" / "manifest.json"
    assert f"manifest: {manifest}" in out
    data = json.loads(manifest.read_text())
    assert data["name"] == "tiny" and data["spec_sha256"] == sha(spec)
    assert data["tools"]["specdeploy"] and data["tools"]["torch"] and data["tools"]["tensorrt_llm"] is None
    assert {"nvidia-modelopt", "transformers", "nvidia-pytriton", "specdeploy_git"} <= set(data["tools"])
    variant = data["variants"]["tiny"]
    assert variant["method"] == "lookahead" and variant["method_reason"].startswith("auto: no heads")
    assert variant["plan"]["tp"] == 2 and variant["plan"]["build"]["max_seq_len"] == 128
    weights = model / "model.safetensors"
    # Paths relative to named roots: the model to the spec's folder, outputs to the engines root.
    assert variant["inputs"]["model"]["root"] == "spec" and variant["inputs"]["model"]["path"] == "model"
    assert variant["inputs"]["model"]["files"]["model.safetensors"] == sha(weights)
    assert "tokenizer.json" in variant["inputs"]["tokenizer"]["files"]
    assert variant["inputs"]["models"]["root"] == "specdeploy"  # the Triton model sources
    engine = tmp_path / "engines" / "tiny" / "engine"
    build = variant["outputs"]["build"]
    assert (build["root"], build["path"], build["state"]) == ("engines", "tiny/engine", "ran")
    assert build["files"]["rank1.safetensors"] == sha(engine / "rank1.safetensors")
    assert variant["outputs"]["package"]["root"] == "triton_repo"
    assert data["spec"] == {"root": "spec", "path": "tiny.yaml"}
    assert all(".specdeploy" not in name for stage in variant["outputs"].values() for name in stage["files"])

    rc, out, err = cli("verify", str(manifest))
    assert rc == 0 and err == "" and "file(s) match" in out
    config = tmp_path / "triton_repo" / "tiny" / "tensorrt_llm" / "config.pbtxt"
    config.write_text(config.read_text() + "\n# edited\n")
    (engine / "config.json").unlink()
    rc, out, err = cli("verify", str(manifest))
    assert rc == 1
    assert err.splitlines() == [
        f"error: {engine / 'config.json'}: missing (tiny build)",
        f"error: {config}: changed (tiny package; sha256 differs from the manifest)",
    ]
    assert cli("verify", str(tmp_path / "nowhere.json"))[0] == 2


def test_hashes_are_cached_by_file_identity(tmp_path, monkeypatch):
    calls = []
    real = hashing.sha256_file
    monkeypatch.setattr(hashing, "sha256_file", lambda path: calls.append(path) or real(path))
    data = tmp_path / "weights.bin"
    data.write_bytes(os.urandom(3 * 1024 + 7))
    link = tmp_path / "linked.bin"
    os.link(data, link)
    cache = HashCache(tmp_path / "cache")
    assert cache.sha256(data) == sha(data) and cache.sha256(link) == sha(data)
    assert HashCache(tmp_path / "cache").sha256(data) == sha(data)
    assert len(calls) == 1  # once for both names of the inode, and for the next run
    stat = data.stat()
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert cache.sha256(data) == sha(data) and len(calls) == 2  # a new mtime: read again


def test_hash_inputs_skips_a_restored_input_that_a_size_and_mtime_fingerprint_rebuilds(cli, tiny_spec):
    spec, model = tiny_spec
    assert cli("engine", str(spec), "--hash-inputs")[0] == 0
    weights = model / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))  # same bytes, new mtime
    rc, out, err = cli("engine", str(spec), "--hash-inputs")
    assert rc == 0, err
    assert out.count("up to date, skipped") == 3
    rc, out, err = cli("engine", str(spec))
    assert rc == 0, err
    assert "[tiny] convert: done" in out
    weights.write_bytes(weights.read_bytes()[:-1] + bytes([weights.read_bytes()[-1] ^ 1]))  # a same-size edit
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    rc, out, err = cli("engine", str(spec), "--hash-inputs")
    assert rc == 0, err
    assert "[tiny] convert: done" in out


def test_bytecode_caches_and_dot_files_are_not_content(tmp_path):
    (tmp_path / "models" / "__pycache__").mkdir(parents=True)
    (tmp_path / "models" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "models" / ".lock").write_text("")
    (tmp_path / "models" / "model.py").write_text("x = 1\n")
    assert [p.name for p in hashing.content_files(tmp_path / "models")] == ["model.py"]
    assert HashCache(None).tree(tmp_path / "models") == {"model.py": sha(tmp_path / "models" / "model.py")}


def test_runs_of_some_variants_keep_the_others_entries(write_spec, tmp_path):
    from pipeline.plan.planner import make_plan
    from pipeline.plan.types import OutputRoots
    from pipeline.release.manifest import write_manifest
    from pipeline.spec.document import load_spec

    spec = write_spec("name: two\nmodel: {preset: llama-3.1-8b}\nvariants:\n  - name: a\n  - name: b\n")
    plan = make_plan(load_spec(spec), OutputRoots(tmp_path / "engines", tmp_path / "t", tmp_path / "c"))
    path = write_manifest(plan, tmp_path / "engines", {"a": {"convert": "unavailable"}}, HashCache(None))
    write_manifest(plan, tmp_path / "engines", {"b": {}}, HashCache(None))
    variants = json.loads(path.read_text())["variants"]
    assert variants["a"]["outputs"]["convert"] == {
        "root": "engines",
        "path": "a/checkpoint",
        "state": "unavailable",
        "files": {},
    }
    assert variants["b"]["outputs"]["build"]["state"] == "not run"
    path.write_text("{not json")
    write_manifest(plan, tmp_path / "engines", {"b": {}}, HashCache(None))
    assert list(json.loads(path.read_text())["variants"]) == ["b"]


def test_the_spec_repository_is_in_the_manifest_and_verified(cli, tiny_spec, tmp_path):
    spec, model = tiny_spec
    spec.write_text(spec.read_text().replace("parallel: {tp: 2}\n", "variants: [{name: a}, {name: b}]\n"))
    rc, _, err = cli("engine", str(spec))
    assert rc == 0, err
    data = json.loads((tmp_path / "engines" / "tiny" / "manifest.json").read_text())
    repo = tmp_path / "triton_repo" / "tiny"
    assert (data["repository"]["root"], data["repository"]["path"]) == ("triton_repo", "tiny")
    ensemble = repo / "b" / "config.pbtxt"
    assert data["repository"]["files"]["b/config.pbtxt"] == sha(ensemble)
    ensemble.write_text(ensemble.read_text() + "\n# edited\n")
    rc, _, err = cli("verify", str(tmp_path / "engines" / "tiny" / "manifest.json"))
    assert rc == 1 and err.strip() == f"error: {ensemble}: changed (tiny repository; sha256 differs from the manifest)"


def test_a_moved_release_verifies_where_it_is(cli, tiny_spec, tmp_path):
    """Built here, then the engines and Triton repository roots move (another volume, another host):
    verify finds the outputs from the manifest's folder and --triton-repo, and nothing else is needed."""
    spec, _ = tiny_spec
    assert cli("engine", str(spec))[0] == 0
    moved = tmp_path / "volume"
    moved.mkdir()
    for root in ("engines", "triton_repo"):
        os.rename(tmp_path / root, moved / root)
    manifest = moved / "engines" / "tiny" / "manifest.json"
    data = json.loads(manifest.read_text())
    located = [data["spec"], data["repository"]] if data["repository"] else [data["spec"]]
    for variant in data["variants"].values():
        located += list(variant["inputs"].values()) + list(variant["outputs"].values())
    assert all(not str(entry["path"]).startswith("/") for entry in located), located
    assert all(not name.startswith("/") for entry in located for name in entry.get("files") or {})
    # The plan as recorded names none of the build host's folders either (the outputs were under tmp_path).
    assert all(str(tmp_path) not in json.dumps(variant["plan"]) for variant in data["variants"].values())
    from pipeline.cli import main  # not the cli fixture: its --triton-repo is the old place

    rc = main(["--triton-repo", str(moved / "triton_repo"), "verify", str(manifest)])
    assert rc == 0
    (moved / "engines" / "tiny" / "engine" / "config.json").unlink()
    assert main(["--triton-repo", str(moved / "triton_repo"), "verify", str(manifest)]) == 1
