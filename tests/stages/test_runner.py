"""The stage runner: atomic outputs, fingerprints, skip on re-run, locks between runs."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from pipeline.errors import StageError
from pipeline.plan.types import StagePlan
from pipeline.stages.runner import FINGERPRINT_FILE, run_stage


def make_stage(tmp_path: Path, **params) -> StagePlan:
    source = tmp_path / "input.txt"
    if not source.exists():
        source.write_text("weights")
    return StagePlan("convert", tmp_path / "out" / "checkpoint", {"model": source}, params or {"tp": 1})


def write_body(calls: list):
    def body(out: Path) -> None:
        calls.append(out)
        (out / "rank0.safetensors").write_text("data")

    return body


def test_output_appears_only_when_complete_and_records_fingerprint(tmp_path):
    calls: list = []
    result = run_stage(make_stage(tmp_path), write_body(calls))
    assert result.status == "ran"
    assert (result.output / "rank0.safetensors").read_text() == "data"
    assert (result.output / FINGERPRINT_FILE).exists()
    assert calls[0].name.startswith(".checkpoint.tmp-")  # the body never writes the real folder
    assert sorted(p.name for p in result.output.parent.iterdir()) == [".checkpoint.lock", "checkpoint"]


def test_rerun_with_nothing_changed_skips(tmp_path):
    calls: list = []
    run_stage(make_stage(tmp_path), write_body(calls))
    assert run_stage(make_stage(tmp_path), write_body(calls)).status == "skipped"
    assert len(calls) == 1
    assert run_stage(make_stage(tmp_path), write_body(calls), force=True).status == "ran"


def test_changed_params_or_inputs_rerun(tmp_path):
    calls: list = []
    run_stage(make_stage(tmp_path), write_body(calls))
    assert run_stage(make_stage(tmp_path, tp=2), write_body(calls)).status == "ran"
    time.sleep(0.01)
    (tmp_path / "input.txt").write_text("new weights")
    assert run_stage(make_stage(tmp_path, tp=2), write_body(calls)).status == "ran"
    assert len(calls) == 3


def test_failed_stage_leaves_no_output_and_keeps_the_previous_one(tmp_path):
    def failing(out: Path) -> None:
        (out / "rank0.safetensors").write_text("half")
        raise StageError("boom")

    with pytest.raises(StageError):
        run_stage(make_stage(tmp_path), failing)
    assert not (tmp_path / "out" / "checkpoint").exists()
    assert not list((tmp_path / "out").glob(".checkpoint.tmp-*"))

    run_stage(make_stage(tmp_path), write_body([]))
    with pytest.raises(StageError):
        run_stage(make_stage(tmp_path, tp=2), failing)
    assert (tmp_path / "out" / "checkpoint" / "rank0.safetensors").read_text() == "data"


def test_leftovers_of_a_killed_run_are_cleaned(tmp_path):
    stale = tmp_path / "out" / ".checkpoint.tmp-99999"
    stale.mkdir(parents=True)
    (stale / "rank0.safetensors").write_text("partial")
    run_stage(make_stage(tmp_path), write_body([]))
    assert not stale.exists()


def _hold_lock(tmp_path: Path, release: Path, started: Path) -> None:
    def slow(out: Path) -> None:
        started.write_text("go")
        while not release.exists():
            time.sleep(0.05)
        (out / "rank0.safetensors").write_text("first")

    run_stage(make_stage(tmp_path), slow)


def test_second_run_on_the_same_output_waits_then_skips(tmp_path):
    release, started = tmp_path / "release", tmp_path / "started"
    holder = multiprocessing.get_context("fork").Process(target=_hold_lock, args=(tmp_path, release, started))
    holder.start()
    try:
        while not started.exists():
            time.sleep(0.05)
        with pytest.raises(StageError, match="still locked by another run"):
            run_stage(make_stage(tmp_path), write_body([]), lock_timeout=0.3, on_wait=lambda _: None)
        messages: list[str] = []
        release.write_text("now")
        result = run_stage(make_stage(tmp_path), write_body([]), on_wait=messages.append)
        assert result.status == "skipped"  # the first run finished the same work
        assert messages and "waiting for another specdeploy run" in messages[0]
        assert (result.output / "rank0.safetensors").read_text() == "first"
    finally:
        release.write_text("now")
        holder.join(10)
