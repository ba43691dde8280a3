"""Nothing a user owns is deleted: every option of the CLI that names a path to write is walked, and each
one, given a file or a folder specdeploy did not write, refuses it (exit 4, the path named) before
any work, and leaves it as it was. A new write option without a case here fails the walk."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pipeline.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
SPEC = str(REPO / "specs" / "llama70b-medusa.yaml")
WRITE_NAMES = {"--out", "--junit-xml", "--report", "--repository"}
INPUTS = {("bench", "--repository")}  # named like an output, read only: the repository the server loaded

# (command, option) -> (the rest of the command line, whether the option names a folder)
CASES: dict[tuple[str, str], tuple[list[str], bool]] = {
    ("build", "--repository"): ([SPEC, "--dry-run"], True),
    ("bench", "--out"): (["--prompts", str(REPO / "pipeline/data/prompts/chat_eval.jsonl")], True),
    ("calibrate", "--out"): (["--gpu", "h100-sxm-80gb", "nowhere"], False),
    ("engine", "--junit-xml"): ([SPEC], False),
    ("evaluate", "--junit-xml"): ([SPEC], False),
    ("train-heads", "--out"): (["--method", "medusa"], True),
    ("train-heads", "--report"): (["--method", "medusa", "--out", "{fresh}"], False),
    ("expand-heads", "--out"): ([str(REPO / "heads" / "smollm2-medusa")], True),
    ("train-adapter", "--out"): (["--task", "code", "--model", "nowhere"], True),
}


def write_options() -> set[tuple[str, str]]:
    parser = build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = set()
    for name, sub in commands.choices.items():
        for action in sub._actions:
            found |= {(name, option) for option in action.option_strings if option in WRITE_NAMES}
    return found - INPUTS


def test_every_write_option_has_a_case():
    assert write_options() == set(CASES)


@pytest.mark.parametrize(("command", "option"), sorted(CASES))
@pytest.mark.parametrize("kind", ["file", "folder"])
def test_an_output_specdeploy_did_not_write_is_refused_and_kept(cli, tmp_path, command, option, kind):
    rest, is_folder = CASES[command, option]
    target = tmp_path / "mine"
    if kind == "file":
        target.write_text("the user's notes\n")
    else:
        target.mkdir()
        (target / "notes.txt").write_text("the user's notes\n")
    before = sorted(p.name for p in target.iterdir()) if target.is_dir() else target.read_text()
    rest = [str(tmp_path / "fresh") if arg == "{fresh}" else arg for arg in rest]
    rc, _, err = cli(command, *rest, option, str(target))
    assert rc == 4, (rc, err)
    assert f"{option} {target}" in err and "Traceback" not in err
    assert (sorted(p.name for p in target.iterdir()) if target.is_dir() else target.read_text()) == before
    assert is_folder or kind == "file" or "a folder where the file to write goes" in err
