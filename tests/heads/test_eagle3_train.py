"""EAGLE-3 drafters trained by ModelOpt (pipeline/heads/eagle3.py): a few steps on SmolLM2 lower the
training-time-test loss, and the folder ModelOpt's export writes is read by read_eagle3 and served
losslessly by the reference EAGLE-3 loop."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from rich.console import Console

from pipeline.commands import heads
from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.heads.eagle3 import Eagle3TrainConfig, draft_vocabulary
from pipeline.heads.export import MANIFEST
from pipeline.heads.refresh import RefreshSettings, refresh_heads
from pipeline.methods.eagle3 import modelopt_capture_layers
from pipeline.methods.eagle3_reader import read_eagle3
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.spec_decode.base import PlainDecoding
from tests.runtime.eagle3_fixtures import ModelOptDrafter
from tests.runtime.fixtures import write_engine
from tests.runtime.test_eagle3 import PROMPTS, decode, eagle3


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--cache-dir", default=".cache")
    heads.register(p.add_subparsers(dest="command", required=True))
    return p


def test_train_heads_lists_eagle3_and_trains_it_as_the_stage_does(tmp_path, monkeypatch):
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["train-heads"]
    assert "eagle3" in sub.format_help()
    calls = []

    def refresh(*args, **kwargs):
        calls.append((args, kwargs))
        args[1].mkdir()  # the drafter folder, which the command moves into place

    monkeypatch.setattr("pipeline.heads.refresh.refresh_heads", refresh)
    out = tmp_path / "heads" / "d"
    args = parser().parse_args(["train-heads", "--method", "eagle3", "--model", str(tmp_path), "--out", str(out)])
    assert args.handler(args, Console(quiet=True)) == 0
    ((target, _, settings, *_), _), = calls  # fmt: skip
    assert target == tmp_path and settings.method == "eagle3" and settings.init is None and out.is_dir()
    assert settings.draft_vocab is None  # the trainer's default


def test_draft_vocab_sizes_an_eagle3_drafter_only(tmp_path, monkeypatch):
    calls = []

    def refresh(*args, **kwargs):
        calls.append(args[2])
        args[1].mkdir()

    monkeypatch.setattr("pipeline.heads.refresh.refresh_heads", refresh)
    common = ["--model", str(tmp_path), "--draft-vocab", "2048", "--out"]
    args = parser().parse_args(["train-heads", "--method", "eagle3", *common, str(tmp_path / "heads" / "d")])
    assert args.handler(args, Console(quiet=True)) == 0
    assert calls[0].draft_vocab == 2048
    args = parser().parse_args(["train-heads", "--method", "eagle", *common, str(tmp_path / "heads" / "e")])
    with pytest.raises(InputError, match="--method eagle3"):
        args.handler(args, Console(quiet=True))


def test_the_draft_vocabulary_is_the_most_frequent_ids():
    from pipeline.heads.data import SeqData

    tokens = torch.tensor([5, 5, 5, 7, 7, 2, 9, 9, 9, 9])
    data = SeqData.from_sequences([tokens], [torch.zeros(10, 4)], [2], [0])
    assert draft_vocabulary(data, 3, 12).tolist() == [5, 7, 9]
    assert draft_vocabulary(data, 5, 12).tolist() == [0, 2, 5, 7, 9]  # ties: lower ids


@pytest.mark.slow
@pytest.mark.smollm2
def test_a_few_steps_lower_the_loss_and_the_drafter_serves_losslessly(smollm2_dir, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setattr("pipeline.heads.eagle3.Eagle3TrainConfig", _Fast)
    settings = RefreshSettings(method="eagle3", init=None, tokens=500, epochs=4, max_new_tokens=40, lr=1e-3)
    out = tmp_path / "drafter"
    manifest = refresh_heads(smollm2_dir, out, settings, say=lambda _: None, cache=tmp_path / "data")
    log = manifest["train_log"]
    assert len(log) == 4 and log[-1]["loss"] < 0.8 * log[0]["first_loss"], log
    geometry = ModelGeometry.from_hf(
        json.loads((smollm2_dir / "config.json").read_text()), "config.json", require_architecture=False
    )
    layout = read_eagle3(out, geometry)
    assert layout.capture_layers == modelopt_capture_layers(geometry.num_layers) == (1, 14, 26)
    assert layout.has_d2t and layout.draft_vocab_size == 2048 and (out / MANIFEST).is_file()
    assert (out / "model.safetensors").stat().st_size < 20 << 20

    engine = Engine.load(write_engine(smollm2_dir, tmp_path / "engine"))
    plain, _ = decode(engine, PlainDecoding(), PROMPTS, batch=3)
    drafter = ModelOptDrafter(out, None, layout.capture_layers)
    served, stats = decode(engine, eagle3(engine, drafter), PROMPTS, batch=3)
    assert served == plain and stats.draft_tokens > 0


class _Fast(Eagle3TrainConfig):
    """A small draft vocabulary and a short warmup: a test's budget."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs | {"draft_vocab": 2048, "warmup": 3, "max_len": 128})
