"""`calibrate` reads its inputs like checkpoints: each bad field of a bench.json or a calibration file is
refused in one line naming the file and the field (exit 2), never a traceback, a hang or a written
calibration with Infinity in it. Literal cases, one bad field each, on a run that calibrates fine."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from pipeline.costmodel import calibrate
from tests.costmodel.test_calibrate import bench_run, runs


def write(folder: Path, change) -> Path:
    """A good Lookahead run at concurrency 4 with ``change(body)`` applied."""
    path = bench_run(folder, "lookahead", 4) / "bench.json"
    body = json.loads(path.read_text())
    change(body)
    path.write_text(json.dumps(body))  # json.dumps writes NaN and Infinity as Python reads them back
    return path


def set_(keys: str, value):
    def change(body: dict) -> None:
        *parents, last = keys.split(".")
        target = body
        for key in parents:
            target = target[key]
        if value is DELETE:
            del target[last]
        else:
            target[last] = value

    return change


DELETE = object()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (set_("tokens_per_second", math.nan), "tokens_per_second: nan"),
        (set_("tokens_per_second", math.inf), "tokens_per_second: inf"),
        (set_("tokens_per_second", -3.0), "tokens_per_second: -3.0"),
        (set_("tokens_per_second", 1e308), "tokens_per_second: 1e+308"),
        (set_("tokens_per_second", "fast"), "tokens_per_second: 'fast'"),
        (set_("concurrency", 0), "concurrency: 0 is not a whole number"),
        (set_("concurrency", -4), "concurrency: -4"),
        (set_("concurrency", 2.7), "concurrency: 2.7"),
        (set_("concurrency", True), "concurrency: True"),
        (set_("concurrency", DELETE), "concurrency: None"),
        (set_("acceptance.mean_acceptance_length", math.nan), "acceptance.mean_acceptance_length: nan"),
        (set_("acceptance.mean_acceptance_length", -3), "acceptance.mean_acceptance_length: -3"),
        (set_("acceptance.mean_acceptance_length", 1e6), "acceptance.mean_acceptance_length: 1000000.0"),
        (set_("batch_mix", {"4": math.nan}), "batch_mix.4: nan"),
        (set_("batch_mix", {"0": 1.0}), "batch_mix.0: a batch must be"),
        (set_("batch_mix", {"4": 0.5}), "batch_mix: the shares add up to 0.5"),
        (set_("server.method", "medusa2"), "server.method: 'medusa2' is not one of"),
        (set_("server.method", DELETE), "server.method: None"),
        (set_("server.arch", DELETE), "server.arch: missing"),
        (set_("server.arch.num_layers", -32), "server.arch.num_layers: -32"),
        (set_("server.arch.num_heads", 0.5), "server.arch.num_heads: 0.5"),
        (set_("server.arch.layers", 3), "server.arch.layers: not a field"),
    ],
)
def test_a_bad_field_is_refused_naming_the_file_and_field(tmp_path, change, field):
    path = write(tmp_path / "run", change)
    with pytest.raises(calibrate.CalibrationError) as info:
        calibrate.read_run(path.parent)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and field in message and "\n" not in message, message


def test_deep_nesting_and_a_fifo_are_refused_not_crashed_on_or_waited_for(tmp_path):
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "bench.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(calibrate.CalibrationError, match="nests too deeply"):
        calibrate.read_run(deep)
    long = tmp_path / "long"
    long.mkdir()
    (long / "bench.json").write_text('{"concurrency": ' + "9" * 5000 + "}")  # over Python's 4300 digits
    with pytest.raises(calibrate.CalibrationError, match="a number too long to be real"):
        calibrate.read_run(long)
    fifo = tmp_path / "fifo" / "bench.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(calibrate.CalibrationError, match="not a regular file|FIFO"):
        calibrate.read_run(fifo.parent)  # read_json opens regular files only: no reader waits on a FIFO


def test_the_cli_refuses_a_bad_run_and_a_folder_as_out_in_one_line(cli, tmp_path):
    good = [str(p) for p in runs(tmp_path / "good")]
    bad = write(tmp_path / "bad", set_("tokens_per_second", math.inf)).parent
    rc, _, err = cli("calibrate", "--gpu", "h100-sxm-80gb", *good, str(bad))
    assert rc == 2 and err.count("error:") == 1 and "tokens_per_second: inf" in err and "Traceback" not in err
    (tmp_path / "folder").mkdir()
    rc, _, err = cli("calibrate", "--gpu", "h100-sxm-80gb", *good, "--out", str(tmp_path / "folder"))
    assert rc == 4 and "--out" in err and "a folder where the file to write goes" in err
    assert list((tmp_path / "folder").iterdir()) == []


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        ("profile.host_step_s", math.inf, "calibration.profile.host_step_s: inf"),
        ("profile.row_compute", math.nan, "calibration.profile.row_compute: nan"),
        ("profile.bandwidth_efficiency", 3.0, "calibration.profile.bandwidth_efficiency: 3.0"),
        ("bands.lookahead.high_error", math.inf, "calibration.bands.lookahead.high_error: inf"),
    ],
)
def test_a_calibration_file_is_read_back_with_the_same_checks(cli, tmp_path, where, value, field):
    out = tmp_path / "calibration.json"
    rc, _, err = cli("calibrate", "--gpu", "h100-sxm-80gb", *[str(p) for p in runs(tmp_path)], "--out", str(out))
    assert rc == 0, err
    assert calibrate.load(out, "h100-sxm-80gb")  # what calibrate writes reads back
    body = json.loads(out.read_text())
    section, *rest = where.split(".")
    target = body["calibration"][section]
    for key in rest[:-1]:
        target = target[key]
    target[rest[-1]] = value
    out.write_text(json.dumps(body))
    with pytest.raises(calibrate.CalibrationError) as info:
        calibrate.load(out, "h100-sxm-80gb")
    assert str(info.value).startswith(f"{out}: ") and field in str(info.value)
