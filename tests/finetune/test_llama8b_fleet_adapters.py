"""The Llama-3.1-8B fleet's 24 adapter configs: what scripts/llama8b_fleet_adapters.py writes, and valid."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from pipeline.costmodel.lora import LORA_MODULES
from pipeline.plan.adapters import read_adapter_config

REPO = Path(__file__).resolve().parents[2]
FOLDER = REPO / "adapters" / "llama8b-fleet"


def generator():
    spec = importlib.util.spec_from_file_location(
        "llama8b_fleet_adapters", REPO / "scripts" / "llama8b_fleet_adapters.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def normalized(path: Path) -> dict:
    data = json.loads(path.read_text())
    data["target_modules"] = sorted(data["target_modules"])  # PEFT saves a set: its order varies
    return data


def test_24_configs_ranks_8_to_64_no_weights():
    folders = sorted(p for p in FOLDER.iterdir() if p.is_dir())
    assert len(folders) == 24
    for folder in folders:
        assert [p.name for p in folder.iterdir()] == ["adapter_config.json"]  # configs only
        config = read_adapter_config(folder)
        assert 8 <= config.r <= 64
        assert config.base_model_name_or_path == "meta-llama/Llama-3.1-8B-Instruct"
        assert set(config.target_modules) <= set(LORA_MODULES)


def test_the_committed_configs_are_what_the_script_writes(tmp_path):
    written = generator().write(tmp_path)
    assert sorted(p.parent.name for p in written) == sorted(p.name for p in FOLDER.iterdir())
    for path in written:
        assert normalized(path) == normalized(FOLDER / path.parent.name / "adapter_config.json"), path.parent.name
