"""A user's model folder for the validate / host-fault tests: a tiny Llama checkpoint with a tokenizer,
and the spec text that points at it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.checkpoint.conftest import random_llama

VOCAB = 96


def write_tokenizer(folder: Path, size: int = VOCAB) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, size)}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 256}))


@pytest.fixture
def model(tmp_path) -> Path:
    """A tiny Llama checkpoint with its tokenizer: what a user's model folder looks like."""
    folder = tmp_path / "model"
    random_llama(0).save_pretrained(folder)
    write_tokenizer(folder)
    return folder


def spec_for(model: Path, extra: str = "", method: str = "lookahead") -> str:
    return (
        f"name: tiny\nmodel:\n  path: {model}\n  dtype: float32\nspeculative:\n  method: {method}\n"
        f"target: reference\n{extra}"
    )
