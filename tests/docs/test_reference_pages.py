"""The generated reference pages: current in the tree, and complete (every command, option, spec
field and contract tensor appears)."""

from __future__ import annotations

import argparse
import doctest
import re

import pytest

from pipeline.cli import EXIT_CODES
from pipeline.docs_gen import cli_reference, markdown, spec_reference
from pipeline.docs_gen.__main__ import COMMAND, PAGES, REFERENCE_DIR, main, render_all, stale, write
from pipeline.docs_gen.markdown import cell, code, table
from pipeline.spec.json_schema import PARTIAL_PREFIX, spec_json_schema
from pipeline.triton import contract


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return render_all()


def test_committed_reference_pages_are_current(tmp_path):
    assert main(["--out", str(tmp_path)]) == 0
    for name in PAGES:
        committed = REFERENCE_DIR / name
        assert committed.is_file(), f"docs/reference/{name} is missing; run `{COMMAND}` and commit it"
        assert committed.read_text(encoding="utf-8") == (tmp_path / name).read_text(encoding="utf-8"), (
            f"docs/reference/{name} is out of date; run `{COMMAND}` and commit the result"
        )


def test_check_names_a_stale_page_and_the_command(tmp_path, capsys, pages):
    write(tmp_path, pages)
    assert stale(tmp_path, pages) == []
    page = tmp_path / "cli.md"
    page.write_text(page.read_text() + "hand edit\n")
    (tmp_path / "spec.md").unlink()
    assert main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'cli.md'} is out of date; run `{COMMAND}`" in err
    assert "spec.md is out of date" in err and "triton-contract.md" not in err


def test_pages_do_not_depend_on_the_environment(monkeypatch, pages):
    before = pages
    for name in cli_reference.ENVIRONMENT_DEFAULTS:
        monkeypatch.setenv(name, "/somewhere/else")
    assert render_all() == before
    assert "/somewhere/else" not in before["cli.md"]


def _commands(parser: argparse.ArgumentParser):
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices.items()


def test_cli_page_has_every_command_option_and_exit_code(pages):
    page = pages["cli.md"]
    root = cli_reference.parser()
    for option in ("--engines-dir", "--triton-repo", "--cache-dir", "--version"):
        assert f"`{option}`" in page
    for name, sub in _commands(root):
        section = page.split(f"## `specdeploy {name}` {{#{name}}}", 1)[1].split("\n## ", 1)[0]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}`" in section, (name, option)
            if not action.option_strings:
                assert action.dest.upper() in section, (name, action.dest)
    for code_ in re.findall(r"^\s+(\d+)\s", EXIT_CODES, flags=re.MULTILINE):
        assert f"| `{code_}` |" in page
    assert "release gate failed" in page.split("## `specdeploy engine`", 1)[1].split("\n## ", 1)[0]


def test_cli_values_and_defaults_as_written_on_a_command_line():
    parser = argparse.ArgumentParser()
    actions = {
        "flag": parser.add_argument("--flag", action="store_true"),
        "optional": parser.add_argument("--ray", nargs="?", metavar="ADDRESS"),
        "many": parser.add_argument("--batch", nargs="+", type=int, default=[1, 8]),
        "choice": parser.add_argument("--method", choices=["medusa", "eagle"], required=True),
        "append": parser.add_argument("--variant", action="append", help="only this variant"),
    }
    assert [cli_reference.value(a) for a in actions.values()] == [
        "",
        "[ADDRESS]",
        "BATCH [BATCH ...]",
        "{medusa,eagle}",
        "VARIANT",
    ]
    assert cli_reference.default(actions["many"]) == "`1 8`" and cli_reference.default(actions["flag"]) == ""
    assert cli_reference.help_text(actions["choice"], "p") == "required"
    assert cli_reference.help_text(actions["append"], "p") == "only this variant; repeatable"


def _schema_paths(schema):
    """Every dotted field path of a spec, from the schema (variants' override copies left out)."""
    defs = schema["$defs"]
    paths = []

    def visit(prefix, node):
        for key, body in node.get("properties", {}).items():
            path = f"{prefix}.{key}" if prefix else key
            paths.append(path)
            name = spec_reference._definition(body)
            if name and not name.startswith(PARTIAL_PREFIX):
                visit(path, defs[name])

    visit("", schema)
    return paths


def test_spec_page_has_every_field_with_its_rules(pages):
    page = pages["spec.md"]
    paths = _schema_paths(spec_json_schema())
    assert len(paths) > 80
    shared = ("heads.eagle.train.", "heads.eagle3.train.")  # the definition of heads.medusa.train, listed once
    for path in paths:
        if path.startswith(shared):
            assert f"heads.medusa.train.{path.split('.train.', 1)[1]}" in page
        else:
            assert f"| `{path}` |" in page, path
    row = next(line for line in page.splitlines() if line.startswith("| `serving.grpc_port` |"))
    assert "`8001`" in row and "1 ≤ value ≤ 65535" in row and "Triton gRPC port" in row
    row = next(line for line in page.splitlines() if line.startswith("| `release.on_fail` |"))
    assert "one of `fallback`, `fail`" in row
    row = next(line for line in page.splitlines() if line.startswith("| `serving.kv_cache_free_gpu_mem_fraction` |"))
    assert "> 0, ≤ 1" in row
    # checks the schema cannot state, as the loader words them
    assert "`kv_cache: fp8 needs weights: fp8 (ModelOpt calibrates both in one pass)`" in page
    assert "`give either 'builtin' or 'path', not both`" in page
    for name in ("mc_sim_7b_63", "llama-3.1-70b", "h100-sxm-80gb", "smollm2-135m-instruct"):
        assert f"`{name}`" in page


def test_spec_rules_in_words():
    assert spec_reference.rules({"type": "integer", "minimum": 1, "maximum": 8}, required=False) == "1 ≤ value ≤ 8"
    assert spec_reference.rules({"type": "number", "exclusiveMinimum": 0}, required=True) == "required; > 0"
    assert spec_reference.rules({"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]}, required=False) == (
        "≥ 1"
    )
    assert spec_reference.rules({"type": "array", "minItems": 2}, required=False) == "at least 2 items"


@pytest.mark.parametrize("model", sorted(contract.CONTRACT))
def test_contract_page_has_every_tensor_of_every_model(model, pages):
    page = pages["triton-contract.md"]
    section = page.split(f"## `{model}` {{#{model}}}", 1)[1].split("\n## ", 1)[0]
    inputs, outputs = contract.CONTRACT[model]
    for tensor in inputs:
        row = next(line for line in section.splitlines() if line.startswith(f"| `{tensor.name}` |"))
        assert f"`{contract.data_type(tensor)}`" in row
        assert ("**required**" in row) is (not tensor.optional), tensor.name
    for tensor in outputs:
        assert f"| `{tensor.name}` |" in section
    extra_inputs, extra_outputs = contract.extensions(model, lookahead=True)
    for tensor in extra_inputs + extra_outputs:
        assert f"| `{tensor.name}` |" in section, tensor.name


def test_markdown_examples():
    assert doctest.testmod(markdown).failed == 0


def test_markdown_cells_keep_tables_whole():
    assert cell("a | b\nc") == "a \\| b c"
    assert code("x`y") == "``x`y``"
    assert table(["h"], [["|"]]).splitlines() == ["| h |", "|---|", "| \\| |"]
    assert cell("engines/<spec>/ or `<spec>`") == "engines/&lt;spec>/ or `<spec>`"


def test_stale_lists_missing_and_changed_pages(tmp_path):
    (tmp_path / "a.md").write_text("same\n")
    (tmp_path / "b.md").write_text("old\n")
    assert stale(tmp_path, {"a.md": "same\n", "b.md": "new\n", "c.md": "x\n"}) == ["b.md", "c.md"]
