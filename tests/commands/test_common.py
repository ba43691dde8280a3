"""SPEC arguments: a path, or the name of one of the project's specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.commands.common import SPECS_DIR, spec_path
from pipeline.errors import InputError
from tests.conftest import REPO


def test_the_project_specs_folder_is_the_repositorys():
    assert SPECS_DIR == REPO / "specs"


def test_a_bare_name_finds_the_project_spec_from_any_folder(cli, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert spec_path("llama70b-eagle.yaml") == REPO / "specs" / "llama70b-eagle.yaml"
    assert spec_path("llama70b-eagle") == REPO / "specs" / "llama70b-eagle.yaml"
    rc, out, err = cli("validate", "llama70b-eagle.yaml")
    assert rc == 0, err
    assert "ok llama70b-eagle: eagle" in out


def test_an_existing_file_wins_over_the_project_spec(monkeypatch, tmp_path):
    (tmp_path / "llama70b-eagle.yaml").write_text("name: mine\n")
    monkeypatch.chdir(tmp_path)
    assert spec_path("llama70b-eagle.yaml").resolve() == tmp_path / "llama70b-eagle.yaml"


def test_an_unknown_name_lists_the_known_specs(cli, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    rc, _, err = cli("engine", "llama70b-egale.yaml")
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("error: llama70b-egale.yaml: spec file not found")
    for name in sorted(p.name for p in (REPO / "specs").glob("*.yaml")):
        assert name in err


def test_a_path_with_a_folder_is_taken_as_given(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "a.yaml").write_text("name: a\n")
    assert spec_path("elsewhere/a.yaml", specs) == Path("elsewhere/a.yaml")
    assert spec_path("a.yaml", specs) == specs / "a.yaml"
    with pytest.raises(InputError, match=r"known specs in .*: a\.yaml"):
        spec_path("b.yaml", specs)
