"""Evaluation prompt files: JSONL or plain text, and file:line errors for bad ones."""

from __future__ import annotations

import pytest

from pipeline.errors import InputError
from pipeline.evaluation.prompts import DEFAULT_FILES, encode, read_prompts


def test_jsonl_and_plain_text(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(
        '{"prompt": "def f(x):"}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n{"input_ids": [1, 2, 3]}\n'
    )
    got = read_prompts(jsonl, 10)
    assert [p.where for p in got] == [f"{jsonl}:1", f"{jsonl}:3", f"{jsonl}:4"]
    assert got[0].text == "def f(x):" and got[1].messages == ({"role": "user", "content": "hi"},)
    assert got[2].input_ids == (1, 2, 3)
    text = tmp_path / "p.txt"
    text.write_text("first prompt\n\nsecond prompt\n")
    assert [p.text for p in read_prompts(text, 1)] == ["first prompt"]


def test_default_sets_alternate_chat_and_code():
    got = read_prompts(None, 4)
    assert [p.where.rsplit(":", 1)[0] for p in got] == [str(DEFAULT_FILES[0]), str(DEFAULT_FILES[1])] * 2
    assert got[0].messages is not None and got[1].text is not None  # chat through the template, code raw


@pytest.mark.parametrize(
    "line, expected",
    [
        ("{not json", "not valid JSON"),
        ('{"text": "x"}', 'one of the fields "prompt", "messages" or "input_ids"'),
        ('{"prompt": "x", "messages": []}', "one of the fields"),
        ('{"prompt": ""}', "non-empty string"),
        ('{"messages": [{"role": "user"}]}', '"messages" must be a non-empty list'),
        ('{"input_ids": [1, -2]}', "integers >= 0"),
    ],
)
def test_bad_jsonl_line_names_file_and_line(tmp_path, line, expected):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(InputError, match=expected) as info:
        read_prompts(path, 10)
    assert str(info.value).startswith(f"{path}:2: ")


def test_missing_file_and_out_of_vocabulary_ids(tmp_path):
    with pytest.raises(InputError, match="evaluation prompts not found"):
        read_prompts(tmp_path / "nope.jsonl", 1)
    path = tmp_path / "p.jsonl"
    path.write_text('{"input_ids": [5, 500]}\n')
    with pytest.raises(InputError, match=f"{path}:1: token id 500 is outside the model's vocabulary"):
        encode(read_prompts(path, 1), None, vocab_size=96)
