"""Outputs of different specs never share a folder: the second spec to write ``engines/base`` is refused
before anything is written, naming both specs, and its --force cannot destroy the first's outputs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pipeline.errors import HostFilesystemError
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec
from pipeline.stages.owners import OWNERS_FILE, claim_outputs, folders
from tests.triton.triton_fixtures import make_model_dir

SPEC = """
name: NAME
model: {path: model, dtype: float32}
build: {max_batch_size: 2, max_input_len: 32, max_seq_len: 64, max_num_tokens: 64}
target: reference
variants:
  - name: base
  - name: OTHER
"""


def plan_of(folder: Path, name: str, other: str):
    make_model_dir(folder / "model")
    (folder / f"{name}.yaml").write_text(textwrap.dedent(SPEC.replace("NAME", name).replace("OTHER", other)))
    roots = OutputRoots(folder / "engines", folder / "triton_repo", folder / "cache")
    return make_plan(load_spec(folder / f"{name}.yaml"), roots)


def test_a_folder_another_spec_owns_is_refused_naming_both(tmp_path):
    first, second = plan_of(tmp_path, "fleet-a", "alpha"), plan_of(tmp_path, "fleet-b", "beta")
    claim_outputs(first)
    owners = json.loads((tmp_path / "engines" / OWNERS_FILE).read_text())
    assert owners["base"] == {"spec": "fleet-a", "file": str(tmp_path / "fleet-a.yaml")}
    with pytest.raises(HostFilesystemError) as info:
        claim_outputs(second)
    message = str(info.value)
    assert info.value.exit_code == 4
    assert f"{tmp_path / 'engines' / 'base'} belongs to spec fleet-a ({tmp_path / 'fleet-a.yaml'})" in message
    assert "fleet-b" in message and "--engines-dir" in message
    assert "beta" not in message  # only the shared folders are named
    # the refused spec claimed nothing, not even the folders nobody owned
    assert "beta" not in json.loads((tmp_path / "engines" / OWNERS_FILE).read_text())
    claim_outputs(second, only={"beta"})  # a variant whose folders are its own runs
    claim_outputs(first)  # and the owner goes on as before


def test_every_folder_a_plan_writes_is_claimed(tmp_path):
    plan = plan_of(tmp_path, "fleet-a", "alpha")
    found = folders(plan)
    assert found[tmp_path / "engines"] == {"base", "alpha"}
    assert found[tmp_path / "triton_repo"] == {"base", "alpha", "fleet-a"}  # the whole-spec repository too


def test_execute_plan_refuses_before_running_any_stage(tmp_path):
    from pipeline.stages.execute import execute_plan

    first, second = plan_of(tmp_path, "fleet-a", "alpha"), plan_of(tmp_path, "fleet-b", "beta")
    claim_outputs(first)
    said: list[str] = []
    with pytest.raises(HostFilesystemError, match="belongs to spec fleet-a"):
        execute_plan(second, force=True, say=said.append)
    assert said == [] and not (tmp_path / "engines" / "beta").exists()


def test_serve_refuses_a_repository_another_spec_built(tmp_path, cli):
    """`serve` of the second spec would otherwise serve the first's build under its own name."""
    first, second = plan_of(tmp_path, "fleet-a", "alpha"), plan_of(tmp_path, "fleet-b", "beta")
    claim_outputs(first)
    (tmp_path / "triton_repo" / "base").mkdir(parents=True)
    rc, _, err = cli("serve", str(second.spec_file), "--variant", "base")  # the cli fixture's roots: tmp_path's
    assert rc == 2 and "Traceback" not in err, err
    assert f"{tmp_path / 'triton_repo' / 'base'} belongs to spec fleet-a" in err and "--engines-dir" in err


def test_a_damaged_owners_file_is_refused_not_read_as_empty(tmp_path):
    first, second = plan_of(tmp_path, "fleet-a", "alpha"), plan_of(tmp_path, "fleet-b", "beta")
    claim_outputs(first)
    (tmp_path / "engines" / OWNERS_FILE).write_text("{garbage")
    with pytest.raises(HostFilesystemError, match="not the table of which spec owns each folder") as info:
        claim_outputs(second)  # read as empty, it would hand engines/base to fleet-b
    assert info.value.exit_code == 4 and str(tmp_path / "engines" / OWNERS_FILE) in str(info.value)
