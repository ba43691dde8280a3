"""Fixtures shared by the Triton tests (helpers live in triton_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from triton_fixtures import make_tokenizer


@pytest.fixture
def tokenizer_dir(tmp_path) -> Path:
    return make_tokenizer(tmp_path / "tokenizer")
