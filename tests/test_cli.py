"""The CLI: every bad-input class is one actionable line on stderr and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_plan_json_for_the_70b_eagle_spec(cli):
    rc, out, err = cli("plan", str(REPO / "specs/llama70b-eagle.yaml"), "--json")
    assert rc == 0, err
    variant = json.loads(out)["variants"][0]
    assert variant["speculative"]["method"] == "eagle"
    assert variant["build"]["max_draft_len"] == 63
    assert variant["build"]["engine_max_seq_len"] == 8192 + 63 + 4
    assert variant["quant"]["weights_fp8"] and variant["world_size"] == 4
    assert variant["memory"]["fits"] is True
    build = variant["commands"]["trtllm_build"]
    assert build[0] == "trtllm-build" and "--speculative_decoding_mode" in build
    assert build[build.index("--max_draft_len") + 1] == "63"
    assert variant["commands"]["gpu_launch"][0] == "mpirun"


@pytest.mark.parametrize("spec", sorted(p.name for p in (REPO / "specs").glob("*.yaml")))
def test_every_example_spec_validates(cli, spec):
    rc, out, err = cli("validate", str(REPO / "specs" / spec))
    assert rc == 0, err
    assert "ok" in out


BAD_INPUTS = {
    "bad_yaml": ("name: x\nmodel: [\n", "invalid YAML"),
    "unknown_key": ("name: x\nmodel: {preset: llama-3.1-8b}\nparalel: {tp: 2}\n", "unknown key 'paralel'"),
    "wrong_type": ("name: x\nmodel: {preset: llama-3.1-8b}\nparallel: {tp: two}\n", "parallel.tp: must be an integer"),
    "duplicate_key": ("name: x\nname: y\nmodel: {preset: llama-3.1-8b}\n", "duplicate key 'name'"),
    "impossible_tp": (
        "name: x\nmodel: {preset: llama-3.1-8b}\nparallel: {tp: 3}\n",
        "does not divide the 32 attention heads",
    ),
    "lookahead_mismatch": (
        "name: x\nmodel: {preset: llama-3.1-8b}\nspeculative:\n  lookahead: {max_draft_len: 9}\n",
        "does not match (W=4, N=3, G=4)",
    ),
    "path_traversal": ("name: x\nmodel: {preset: llama-3.1-8b}\nvariants:\n  - name: ../../etc\n", "variants[0].name"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(cli, write_spec, case):
    text, expected = BAD_INPUTS[case]
    path = write_spec(text)
    rc, out, err = cli("validate", str(path))
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith(f"error: {path}:"), err
    assert expected in err


def test_unreadable_file_exit_2(cli, tmp_path):
    rc, _, err = cli("plan", str(tmp_path / "nope.yaml"))
    assert rc == 2 and err == f"error: {tmp_path / 'nope.yaml'}: spec file not found\n"


def test_no_traceback_from_the_real_entry_point(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\nmodel: {preset: llama-3.1-8b}\nparallel: {tp: 0}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "validate", str(spec)], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "parallel.tp: must be >= 1" in proc.stderr


def test_help_lists_the_exit_codes_release_gate_is_6(capsys):
    from pipeline.cli import build_parser
    from pipeline.errors import DiskFullError, HostFilesystemError
    from pipeline.evaluation.result import RELEASE_EXIT_CODE

    assert (RELEASE_EXIT_CODE, HostFilesystemError.exit_code, DiskFullError.exit_code) == (6, 4, 5)
    for argv in (["--help"], ["engine", "--help"], ["evaluate", "--help"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        text = " ".join(capsys.readouterr().out.split())
        assert "6: a release gate failed" in text or "6 a release gate failed" in text, argv
        assert "the disk is full" in text and "filesystem refused" in text


def test_help_groups_every_command_once_and_every_option_has_help(capsys):
    """`specdeploy --help` lists the commands by what a user does with them; every option says what it is."""
    import argparse

    from pipeline.cli import GROUPS, build_parser

    parser = build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    grouped = [name for _, names in GROUPS for name in names]
    assert sorted(grouped) == sorted(commands.choices), "each command in exactly one group"
    undocumented = [
        f"{name} {action.option_strings or action.dest}"
        for name, sub in commands.choices.items()
        for action in sub._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert undocumented == []
    with pytest.raises(SystemExit):
        parser.parse_args(["predict", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--tp TP tensor-parallel GPUs (default: 1)" in text  # the default said once, by the formatter
    assert "(default: None)" not in text and "(default: False)" not in text


def test_plan_of_a_fleet_answers_in_its_first_lines(cli):
    """The 25-variant LoRA fleet: does it fit and what the fleet gains come first, then one row per
    variant; one variant's whole table on request."""
    spec = str(REPO / "specs" / "llama8b-lora-fleet.yaml")
    rc, out, _ = cli("plan", spec)
    lines = out.splitlines()
    assert rc == 0 and len(lines) < 60, len(lines)
    assert "fits on 2 x l40s" in lines[1]
    assert "23 shared on one engine, 1 merged; fleet speedup" in lines[2]
    assert sum("adapter_config.json only" in line for line in lines) == 1  # one note for the 24 fine-tunes
    rc, out, _ = cli("plan", spec, "--variant", "support")
    assert rc == 0 and "variant support" in out and "stage build" in out and "variant sql" not in out
    rc, _, err = cli("plan", spec, "--variant", "nope")
    assert rc == 2 and "--variant nope: not in" in err
