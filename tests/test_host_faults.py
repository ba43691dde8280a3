"""Faults of the host (read-only or full filesystems, permissions, files where folders must be,
dangling symlinks) are one-line errors naming the path, with their own exit codes 4 and 5.

A read-only or full filesystem cannot be made here without privileges, so those cases raise the
kernel's OSError at the syscall the runner makes; everything else is the real filesystem."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pipeline.errors import DiskFullError, HostFilesystemError, host_error
from pipeline.io import atomic
from pipeline.plan.types import StagePlan
from pipeline.stages.runner import run_stage
from tests.preflight_fixtures import model, spec_for  # noqa: F401  (model: a fixture)

ROOT = os.geteuid() == 0


def stage_at(output: Path, tmp_path: Path) -> StagePlan:
    source = tmp_path / "input.txt"
    source.write_text("weights")
    return StagePlan("convert", output, {"model": source}, {"tp": 1})


def body(out: Path) -> None:
    (out / "rank0.safetensors").write_text("data")


def one_line(exc: BaseException) -> str:
    message = str(exc)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize(
    "code, kind, exit_code, words",
    [
        (errno.EROFS, HostFilesystemError, 4, "read-only filesystem"),
        (errno.EACCES, HostFilesystemError, 4, "permission denied"),
        (errno.EPERM, HostFilesystemError, 4, "not permitted"),
        (errno.ENOTDIR, HostFilesystemError, 4, "regular file where a folder must be"),
        (errno.EEXIST, HostFilesystemError, 4, "already exists as a file"),
        (errno.ENOSPC, DiskFullError, 5, "full disk"),
        (errno.EDQUOT, DiskFullError, 5, "quota"),
        (errno.EIO, HostFilesystemError, 4, "Input/output error"),
    ],
)
def test_host_error_maps_errno_to_an_exit_code_and_advice(code, kind, exit_code, words):
    error = host_error(OSError(code, os.strerror(code), "/data/engines/v"), "writing the build stage's output")
    assert type(error) is kind and error.exit_code == exit_code
    message = one_line(error)
    assert message.startswith("/data/engines/v ") and words in message and "while writing the build" in message


def test_engines_dir_that_is_a_regular_file(tmp_path):
    root = tmp_path / "engines"
    root.write_text("not a folder")
    with pytest.raises(HostFilesystemError) as info:
        run_stage(stage_at(root / "v" / "checkpoint", tmp_path), body)
    assert info.value.exit_code == 4 and str(root) in one_line(info.value)


@pytest.mark.parametrize("kind", ["regular file", "dangling symlink", "symlink to a folder"])
def test_what_specdeploy_did_not_write_where_an_output_goes_is_refused_and_kept(tmp_path, kind):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("user data")
    output = tmp_path / "out" / "checkpoint"
    output.parent.mkdir()
    if kind == "regular file":
        output.write_text("stray")
    else:
        output.symlink_to(elsewhere if kind == "symlink to a folder" else tmp_path / "vanished")
    ran = []
    with pytest.raises(HostFilesystemError) as info:
        run_stage(stage_at(output, tmp_path), lambda out: ran.append(out))
    message = one_line(info.value)
    assert info.value.exit_code == 4 and message.startswith(f"{output} is a ") and "move or remove it" in message
    assert not ran and os.path.lexists(output) and (elsewhere / "keep.txt").read_text() == "user data"
    assert output.read_text() == "stray" if kind == "regular file" else output.is_symlink()
    assert sorted(p.name for p in output.parent.iterdir()) == [".checkpoint.lock", "checkpoint"]


def test_a_folder_of_files_specdeploy_did_not_write_is_refused_and_kept(tmp_path):
    """A non-empty folder without the runner's fingerprint file is someone else's: not replaced."""
    output = tmp_path / "repo" / "smollm2-lookahead"
    output.mkdir(parents=True)
    (output / "notes.txt").write_text("user data")
    ran = []
    with pytest.raises(HostFilesystemError) as info:
        run_stage(stage_at(output, tmp_path), lambda out: ran.append(out))
    message = one_line(info.value)
    assert info.value.exit_code == 4 and message.startswith(f"{output} holds files specdeploy did not write")
    assert not ran and (output / "notes.txt").read_text() == "user data"
    # An empty folder, and specdeploy's own earlier output, are replaced as before.
    (output / "notes.txt").unlink()
    assert run_stage(stage_at(output, tmp_path), body).status == "ran"
    assert run_stage(stage_at(output, tmp_path), body, force=True).status == "ran"


def test_cli_engine_with_a_file_where_a_stage_folder_goes(tmp_path, model, write_spec, capsys):  # noqa: F811
    from pipeline.cli import main

    stray = tmp_path / "engines" / "tiny" / "checkpoint"
    stray.parent.mkdir(parents=True)
    stray.write_text("my notes")
    roots = ["--engines-dir", str(tmp_path / "engines"), "--triton-repo", str(tmp_path / "repo")]
    rc = main([*roots, "engine", str(write_spec(spec_for(model)))])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert rc == 4 and len(err) == 1 and f"{stray} is a regular file" in err[0]
    assert stray.read_text() == "my notes"


def test_full_disk_during_a_stage_keeps_the_previous_output(tmp_path):
    output = tmp_path / "out" / "checkpoint"
    stage = stage_at(output, tmp_path)
    run_stage(stage, body)

    def full(out: Path) -> None:
        (out / "rank0.safetensors").write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "rank0.safetensors"))

    with pytest.raises(DiskFullError) as info:
        run_stage(stage, full, force=True)
    assert info.value.exit_code == 5 and "free space and re-run" in one_line(info.value)
    assert (output / "rank0.safetensors").read_text() == "data"
    assert not list(output.parent.glob(".checkpoint.tmp-*"))


def test_read_only_filesystem_on_the_lock_file(tmp_path, monkeypatch):
    output = tmp_path / "out" / "checkpoint"
    output.parent.mkdir()
    real_open = open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(atomic, "open", read_only, raising=False)
    with pytest.raises(HostFilesystemError) as info:
        run_stage(stage_at(output, tmp_path), body)
    message = one_line(info.value)
    assert ".checkpoint.lock is on a read-only filesystem" in message and "--engines-dir" in message


@pytest.mark.skipif(ROOT, reason="root ignores file permissions")
def test_output_root_without_write_permission(tmp_path):
    root = tmp_path / "engines"
    root.mkdir()
    root.chmod(0o500)
    try:
        with pytest.raises(HostFilesystemError) as info:
            run_stage(stage_at(root / "v" / "checkpoint", tmp_path), body)
        assert "permission denied" in one_line(info.value)
    finally:
        root.chmod(0o700)


def test_cache_dir_that_is_a_regular_file(tmp_path):
    from pipeline.embedded import prepare_embedded_model

    cache = tmp_path / "cache"
    cache.write_text("oops")
    with pytest.raises(HostFilesystemError) as info:
        prepare_embedded_model(cache)
    assert str(cache) in one_line(info.value) and "--cache-dir" in str(info.value)


def test_cli_engine_with_engines_dir_a_regular_file(tmp_path, model, write_spec, capsys):  # noqa: F811
    from pipeline.cli import main

    engines = tmp_path / "engines-file"
    engines.write_text("")
    rc = main(
        [
            "--engines-dir",
            str(engines),
            "--triton-repo",
            str(tmp_path / "repo"),
            "engine",
            str(write_spec(spec_for(model))),
        ]
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert rc == 4 and len(err) == 1 and str(engines) in err[0]


# -- the real thing, where an unprivileged mount namespace is available (unshare -rm) ----------------

_CHILD = """
import sys
from pathlib import Path
from pipeline.errors import SpecdeployError
from pipeline.plan.types import StagePlan
from pipeline.stages.runner import run_stage

source, output, size = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
stage = StagePlan("convert", output, {"model": source}, {"tp": 1})


def body(out):
    if source.is_dir():  # the package stage's copy of the tokenizer
        from pipeline.triton.repository import copy_tokenizer

        copy_tokenizer(source, out / "preprocessing" / "tokenizer")
    else:
        (out / "rank0.safetensors").write_bytes(b"x" * size)


try:
    run_stage(stage, body, force=True, on_wait=lambda _: None)
    print("ok")
except SpecdeployError as exc:
    print(exc.exit_code, exc)
"""


def _in_mount_namespace(tmp_path: Path, mount: str, size: int, source: Path | None = None) -> str:
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unprivileged mount namespaces are not available here")
    if source is None:
        source = tmp_path / "input.txt"
        source.write_text("weights")
    (tmp_path / "child.py").write_text(_CHILD)
    root = tmp_path / "mnt"
    root.mkdir(exist_ok=True)
    script = f"{mount} && {sys.executable} {tmp_path / 'child.py'} {source} {root / 'v' / 'checkpoint'} {size}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script.replace("ROOT", str(root))],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_real_read_only_filesystem_is_exit_4(tmp_path):
    line = _in_mount_namespace(tmp_path, "mount -t tmpfs -o ro tmpfs ROOT", 10)
    assert line.startswith("4 ") and "read-only filesystem" in line


def test_a_real_full_disk_is_exit_5(tmp_path):
    line = _in_mount_namespace(tmp_path, "mount -t tmpfs -o size=256k tmpfs ROOT", 4 * 2**20)
    assert line.startswith("5 ") and "full disk" in line


def test_a_full_disk_while_packaging_names_the_file_being_written_not_its_source(tmp_path):
    tokenizer = tmp_path / "model"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_bytes(b"{" + b" " * 2**20 + b"}")  # 1 MiB onto a 256 KiB disk
    line = _in_mount_namespace(tmp_path, "mount -t tmpfs -o size=256k tmpfs ROOT", 0, source=tokenizer)
    assert line.startswith("5 ") and "full disk" in line
    written = line.split()[1]
    assert "/mnt/v/.checkpoint.tmp-" in written and written.endswith("/preprocessing/tokenizer/tokenizer.json")
    assert str(tokenizer) not in line.split(" is on a full disk")[0]


@pytest.mark.parametrize("root", ["engines", "repo"])
def test_a_variant_folder_that_is_a_symlink_out_of_its_root_is_one_filesystem_error(
    tmp_path,
    model,  # noqa: F811
    write_spec,
    capsys,
    root,
):
    from pipeline.cli import main

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / root).mkdir()
    (tmp_path / root / "tiny").symlink_to(elsewhere)
    roots = ["--engines-dir", str(tmp_path / "engines"), "--triton-repo", str(tmp_path / "repo")]
    rc = main([*roots, "engine", str(write_spec(spec_for(model)))])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 4 and len(err) == 1, err
    assert f"{tmp_path / root / 'tiny'} is a symlink to {elsewhere}" in err[0]
    assert list(elsewhere.iterdir()) == []


@pytest.mark.slow
def test_engine_on_up_to_date_outputs_of_a_read_only_filesystem_is_done(tmp_path, model, write_spec):  # noqa: F811
    """An artifact mounted read-only (a verification job): nothing needs writing, so no lock either."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("unprivileged mount namespaces are not available here")
    from pipeline.cli import main

    spec = write_spec(spec_for(model))
    args = ["--engines-dir", str(tmp_path / "engines"), "--triton-repo", str(tmp_path / "repo")]
    args += ["--cache-dir", str(tmp_path / "cache"), "engine", str(spec)]
    assert main(args) == 0
    cli = [sys.executable, "-m", "pipeline.cli", *args]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    read_only = f'mount --bind {tmp_path} {tmp_path} && mount -o remount,bind,ro {tmp_path} && exec "$@"'
    again = subprocess.run(
        ["unshare", "-rm", "sh", "-c", read_only, "sh", *cli], capture_output=True, text=True, env=env, timeout=300
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert again.stdout.count("up to date, skipped") == 3 and "error" not in again.stderr
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    write = subprocess.run(  # the same mount refuses what does need writing: exit 4, as before
        ["unshare", "-rm", "sh", "-c", read_only, "sh", *cli, "--force"], capture_output=True, text=True, env=env
    )
    assert write.returncode == 4 and "read-only filesystem" in write.stderr
