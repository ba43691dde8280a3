"""The CLI answers at once: ``--help`` and ``validate`` of a spec without weights import no heavy library.

A time cannot be asserted on a loaded host; what is imported can, and decides the time
(bench/cli_startup.py measures it: torch alone takes ~1.5 s to import, scipy.optimize ~0.6 s,
tritonclient's gRPC ~0.2 s, against ~0.04 s for the bare interpreter). Each case runs in a fresh
interpreter, which is what a user's shell starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numpy", "scipy", "tritonclient", "transformers", "safetensors.torch", "ray", "peft", "modelopt")
PROBE = """
import contextlib, io, json, sys
from pipeline.cli import build_parser, main
if sys.argv[1:] == ["--parser"]:
    build_parser()
else:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(sys.argv[1:]) == 0
print(json.dumps(sorted(sys.modules)))
"""


def imported(*argv: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_the_parser_imports_nothing_heavy():
    """Every command's ``register`` runs for ``--help``; rich, pydantic and yaml wait for a command too."""
    modules = imported("--parser")
    assert not modules & {*HEAVY, "rich", "pydantic", "yaml"}, sorted(modules & {*HEAVY, "rich", "pydantic", "yaml"})


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_validating_a_spec_without_weights_imports_nothing_heavy(command):
    modules = imported(command, str(REPO / "specs" / "llama70b-eagle.yaml"))
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_planning_a_fleet_of_adapter_configs_imports_no_torch():
    """specs/llama8b-lora-fleet.yaml's 24 adapters are adapter_config.json alone: there are no tensors to
    check, so the checkpoint readers (torch) are not imported; the LoRA decision's numpy and scipy are."""
    modules = imported("plan", str(REPO / "specs" / "llama8b-lora-fleet.yaml"))
    assert not modules & {"torch", "transformers", "peft", "modelopt"}, sorted(modules & {"torch", "transformers"})
