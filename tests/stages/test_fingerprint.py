"""Same size, same mtime: the cheap fingerprint still sees an edit (inode and ctime), and content
hashing is the opt-in for pipelines that restore files (new inodes and ctimes, same bytes)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.plan.types import StagePlan
from pipeline.stages.runner import FINGERPRINT_ENV, FINGERPRINT_FILE, fingerprint, run_stage


def body(out: Path) -> None:
    (out / "rank0.safetensors").write_text("data")


def stage_on(tmp_path: Path, source: Path) -> StagePlan:
    return StagePlan("convert", tmp_path / "out" / "checkpoint", {"model": source}, {"tp": 1})


def edit_keeping_size_and_mtime(path: Path, data: bytes) -> None:
    before = path.stat()
    # The kernel stamps ctime from its coarse clock (a few ms per tick): let it pass the old stamp so
    # the edit gets a new ctime, as it does whenever an edit comes a tick or more after the last one.
    probe = path.with_name(".ctime-probe")
    while True:
        probe.write_bytes(b"")
        if probe.stat().st_ctime_ns > before.st_ctime_ns:
            break
        time.sleep(0.001)
    probe.unlink()
    assert len(data) == before.st_size
    with open(path, "r+b") as handle:
        handle.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert after.st_ctime_ns != before.st_ctime_ns


@pytest.fixture
def weights(tmp_path) -> Path:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"A" * 1000)
    return path


def test_unchanged_input_skips(tmp_path, weights):
    stage = stage_on(tmp_path, weights)
    assert run_stage(stage, body).status == "ran"
    assert run_stage(stage, body).status == "skipped"


def test_in_place_edit_with_size_and_mtime_restored_reruns(tmp_path, weights):
    stage = stage_on(tmp_path, weights)
    run_stage(stage, body)
    edit_keeping_size_and_mtime(weights, b"B" * 1000)
    assert run_stage(stage, body).status == "ran"
    assert run_stage(stage, body).status == "skipped"


def test_file_swapped_for_another_with_equal_size_and_mtime_reruns(tmp_path, weights):
    stage = stage_on(tmp_path, weights)
    run_stage(stage, body)
    other = tmp_path / "other.bin"
    other.write_bytes(b"C" * 1000)
    stat = weights.stat()
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(other, weights)  # a new inode under the old name
    assert run_stage(stage, body).status == "ran"


def test_edit_inside_an_input_folder_reruns(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"a": 1}')
    (folder / "model.safetensors").write_bytes(b"A" * 64)
    stage = stage_on(tmp_path, folder)
    run_stage(stage, body)
    edit_keeping_size_and_mtime(folder / "model.safetensors", b"Z" * 64)
    assert run_stage(stage, body).status == "ran"


def test_hard_links_into_a_stage_output_do_not_rerun_its_consumers(tmp_path):
    """The reference build hard-links the checkpoint's files (their ctime changes, not their bytes)."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "rank0.safetensors").write_text("weights")
    (checkpoint / FINGERPRINT_FILE).write_text("{}")
    engine_stage = StagePlan("build", tmp_path / "engine", {"checkpoint": checkpoint}, {})

    def link(out: Path) -> None:
        os.link(checkpoint / "rank0.safetensors", out / "rank0.safetensors")

    assert run_stage(engine_stage, link).status == "ran"
    assert run_stage(engine_stage, link).status == "skipped"
    assert run_stage(engine_stage, link, force=True).status == "ran"
    assert run_stage(engine_stage, link).status == "skipped"


def test_content_mode_ignores_restored_files_but_sees_edits(tmp_path, weights, monkeypatch):
    monkeypatch.setenv(FINGERPRINT_ENV, "content")
    stage = stage_on(tmp_path, weights)
    run_stage(stage, body)
    backup = tmp_path / "backup.bin"
    shutil.copyfile(weights, backup)
    os.replace(backup, weights)  # restored from a cache: new inode, new ctime and mtime, same bytes
    assert run_stage(stage, body).status == "skipped"
    edit_keeping_size_and_mtime(weights, b"D" * 1000)
    assert run_stage(stage, body).status == "ran"


def test_the_stat_fingerprint_records_inode_and_ctime(tmp_path, weights):
    stat = weights.stat()
    identity = fingerprint(stage_on(tmp_path, weights))["inputs"]["model"]["identity"]
    assert identity == [stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns]


def test_unknown_fingerprint_mode_is_an_input_error(tmp_path, weights, monkeypatch):
    monkeypatch.setenv(FINGERPRINT_ENV, "sha1")
    with pytest.raises(InputError, match="SPECDEPLOY_FINGERPRINT='sha1'"):
        run_stage(stage_on(tmp_path, weights), body)
