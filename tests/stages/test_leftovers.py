"""Nothing left behind: any run holding a stage's lock removes the temp and old folders of runs
that were killed, says how much it freed, and recognises lock files of dead owners."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from pipeline.errors import StageError
from pipeline.io.atomic import exclusive_lock, pid_alive, remove_dead_leftovers
from pipeline.plan.types import StagePlan
from pipeline.stages.runner import run_stage


def dead_pid() -> int:
    """A pid that is not running: a child that has exited and been reaped."""
    process = multiprocessing.get_context("fork").Process(target=lambda: None)
    process.start()
    process.join()
    assert not pid_alive(process.pid)
    return process.pid


def make_stage(tmp_path: Path) -> StagePlan:
    source = tmp_path / "input.txt"
    if not source.exists():
        source.write_text("weights")
    return StagePlan("convert", tmp_path / "out" / "checkpoint", {"model": source}, {"tp": 1})


def body(out: Path) -> None:
    (out / "rank0.safetensors").write_text("data")


def leftover(parent: Path, name: str, size: int = 4096) -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    (folder / "rank0.safetensors").write_bytes(b"x" * size)
    return folder


def test_a_skipping_rerun_still_removes_dead_temp_folders_and_reports_the_size(tmp_path):
    stage = make_stage(tmp_path)
    run_stage(stage, body)
    stale = leftover(stage.output.parent, f".checkpoint.tmp-{dead_pid()}", size=3 * 2**20)
    messages: list[str] = []
    assert run_stage(stage, body, on_wait=messages.append).status == "skipped"
    assert not stale.exists()
    assert any("removed 1 leftover(s) of killed runs, 3.0 MiB freed" in m and stale.name in m for m in messages)


def test_old_folders_files_and_symlinks_of_dead_runs_are_removed(tmp_path):
    stage = make_stage(tmp_path)
    parent = stage.output.parent
    # Three pids of exited children (pid + 1 could be any process on a busy host).
    old_dir = leftover(parent, f".checkpoint.old-{dead_pid()}")
    old_file = parent / f".checkpoint.old-{dead_pid()}"
    old_file.write_text("was a regular-file output")
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep").write_text("user data")
    old_link = parent / f".checkpoint.old-{dead_pid()}"
    old_link.symlink_to(target)
    run_stage(stage, body, on_wait=lambda _: None)
    for path in (old_dir, old_file, old_link):
        assert not os.path.lexists(path)
    assert (target / "keep").read_text() == "user data"


def test_leftovers_of_a_live_process_are_kept(tmp_path):
    parent = tmp_path / "out"
    alive = leftover(parent, f".checkpoint.tmp-{os.getppid()}")
    mine = leftover(parent, f".checkpoint.tmp-{os.getpid()}")
    removed, freed = remove_dead_leftovers(parent, "checkpoint")
    assert alive.exists() and not mine.exists()
    assert removed == [mine] and freed == 4096


def test_other_outputs_leftovers_are_not_touched(tmp_path):
    parent = tmp_path / "out"
    other = leftover(parent, f".engine.tmp-{dead_pid()}")
    removed, _ = remove_dead_leftovers(parent, "checkpoint")
    assert removed == [] and other.exists()


def test_lock_file_of_a_killed_owner_is_recognised_on_takeover(tmp_path):
    lock = tmp_path / ".checkpoint.lock"
    pid = dead_pid()
    lock.write_text(f"pid {pid}\n")
    messages: list[str] = []
    with exclusive_lock(lock, timeout=1, what="out/checkpoint", on_wait=messages.append):
        assert lock.read_text() == f"pid {os.getpid()}\n"
    assert messages == [
        f"out/checkpoint: the previous run (pid {pid}) was killed while holding the lock; "
        "taking over and removing its leftovers"
    ]
    assert lock.read_text() == ""  # released cleanly: nothing for the next run to report


def test_waiting_message_says_when_the_recorded_holder_is_not_running(tmp_path):
    lock = tmp_path / ".checkpoint.lock"
    pid = dead_pid()
    with open(lock, "a+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # held, but the file names a pid that is gone
        holder.write(f"pid {pid}\n")
        holder.flush()
        messages: list[str] = []
        with pytest.raises(StageError, match="still locked"):
            with exclusive_lock(lock, timeout=0.2, what="out/checkpoint", on_wait=messages.append):
                pass
    assert f"pid {pid} recorded, which is not running here" in messages[0]


def test_waiting_message_names_a_live_holder(tmp_path):
    lock = tmp_path / ".checkpoint.lock"
    with open(lock, "a+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        holder.write(f"pid {os.getpid()}\n")
        holder.flush()
        messages: list[str] = []
        with pytest.raises(StageError):
            with exclusive_lock(lock, timeout=0.2, what="x", on_wait=messages.append):
                pass
    assert messages == [f"waiting for another specdeploy run on x (pid {os.getpid()})"]


def _forced_run_that_hangs(tmp_path: Path, started: Path) -> None:
    def hang(out: Path) -> None:
        (out / "rank0.safetensors").write_bytes(b"x" * 2**20)
        started.write_text("go")
        time.sleep(60)

    run_stage(make_stage(tmp_path), hang, force=True, on_wait=lambda _: None)


def test_kill_9_during_force_leaves_nothing_after_the_next_run(tmp_path):
    stage = make_stage(tmp_path)
    run_stage(stage, body)
    started = tmp_path / "started"
    child = multiprocessing.get_context("fork").Process(target=_forced_run_that_hangs, args=(tmp_path, started))
    child.start()
    try:
        while not started.exists():
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.join(10)
    assert list(stage.output.parent.glob(".checkpoint.tmp-*"))  # what the kill left
    messages: list[str] = []
    assert run_stage(stage, body, on_wait=messages.append).status == "skipped"
    assert not list(stage.output.parent.glob(".checkpoint.tmp-*"))
    assert any(f"previous run (pid {child.pid}) was killed" in m for m in messages)
    assert any("1.0 MiB freed" in m for m in messages)
    assert (stage.output / "rank0.safetensors").read_text() == "data"


def test_embedded_cache_leftovers_of_dead_runs_are_reported(tmp_path, monkeypatch):
    import pipeline.embedded as embedded

    name = "smollm2-135m-instruct"
    stale = leftover(tmp_path, f".{name}.tmp-{dead_pid()}-abc")
    messages: list[str] = []

    def fake_convert(gguf, model, out, say):  # the GGUF conversion is another test's subject
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(embedded, "_convert_gguf", fake_convert)
    embedded.prepare_embedded_model(tmp_path, progress=messages.append)
    assert not stale.exists()
    assert any("removed 1 leftover(s) of killed runs" in m for m in messages)
