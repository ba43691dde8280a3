"""`specdeploy train-heads` / `expand-heads` register and parse (the lead wires them into cli.py)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from rich.console import Console

from pipeline.commands import heads
from pipeline.errors import StageUnavailable
from pipeline.heads.export import export_medusa
from pipeline.heads.medusa import MedusaResBlocks
from pipeline.methods import heads_reader
from tests.heads.conftest import HIDDEN, VOCAB


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--cache-dir", default=".cache")
    heads.register(p.add_subparsers(dest="command", required=True))
    return p


def test_train_heads_arguments():
    args = parser().parse_args(["train-heads", "--method", "eagle", "--model", "m", "--out", "heads/x"])
    assert args.handler is heads.cmd_train_heads
    assert (args.method, args.model, args.out, args.seed, args.threads) == ("eagle", "m", "heads/x", 0, 1)


def test_train_heads_on_cuda_never_falls_back_to_the_cpu(tmp_path, monkeypatch):
    # The embedded model's trainer has no device setting; --device cuda takes the path that has one.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "heads" / "x"
    args = parser().parse_args(["train-heads", "--method", "eagle", "--model", str(tmp_path), "--out", str(out),
                                "--device", "cuda"])  # fmt: skip
    with pytest.raises(StageUnavailable, match="needs a CUDA GPU"):
        args.handler(args, Console(quiet=True))
    assert not out.exists()


def test_expand_heads_command(tmp_path, tiny_base, capsys):
    torch.manual_seed(0)
    export_medusa(
        MedusaResBlocks(HIDDEN, 2),
        tmp_path / "shipped",
        hidden_size=HIDDEN,
        vocab_size=VOCAB,
        base_model="tiny",
        info={},
        readme="",
    )
    args = parser().parse_args(
        [
            "expand-heads",
            str(tmp_path / "shipped"),
            "--out",
            str(tmp_path / "out"),
            "--model",
            str(tiny_base),
            "--dtype",
            "float16",
        ]
    )
    assert args.handler(args, Console(file=open("/dev/null", "w"))) == 0
    assert heads_reader.inspect_medusa(tmp_path / "out").num_heads == 2
    args = parser().parse_args(["expand-heads", str(tmp_path / "shipped"), "--out", str(tmp_path / "again"),
                                "--model", str(tiny_base), "--json"])  # fmt: skip
    assert args.handler(args, Console(file=open("/dev/null", "w"))) == 0
    assert json.loads(capsys.readouterr().out) == {"heads_dir": str(tmp_path / "again")}
