"""Calibration files: formats, and one-line errors that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.quantize.calibration import DEFAULT_CALIBRATION, read_calibration, tokenize_samples


def _write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def _error(path: Path) -> str:
    with pytest.raises(InputError) as info:
        read_calibration(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_txt_with_blank_lines_is_one_sample_per_paragraph(tmp_path):
    path = _write(tmp_path, "c.txt", "\n\nfirst line\nstill first\n\n\nsecond\n\ndef f():\n    return 1\n\n")
    samples = read_calibration(path)
    assert [s.text for s in samples] == ["first line\nstill first", "second", "def f():\n    return 1"]
    assert samples[1].where == f"{path}:7"


def test_txt_without_blank_lines_is_one_sample_per_line(tmp_path):
    path = _write(tmp_path, "c.txt", "\none\n  two  \nthree\n\n")  # outer blank lines do not count
    assert [s.text for s in read_calibration(path)] == ["one", "two", "three"]


def test_jsonl_text_and_messages(tmp_path):
    lines = [
        json.dumps({"text": "hello there"}),
        "",
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}),
    ]
    samples = read_calibration(_write(tmp_path, "c.jsonl", "\n".join(lines) + "\n"))
    assert samples[0].text == "hello there" and samples[0].messages is None
    assert samples[1].messages == ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"})
    assert samples[1].where.endswith(":3")


@pytest.mark.parametrize(
    "line, expected",
    [
        ('{"text": "ok"', "not valid JSON"),
        ('["text"]', "expected a JSON object"),
        ('{"prompt": "x"}', "needs a 'text' string or a 'messages' list (keys found: prompt)"),
        ('{"text": "   "}', "'text' must be a non-empty string"),
        ('{"text": 3}', "'text' must be a non-empty string"),
        ('{"messages": []}', "'messages' must be a non-empty list"),
        ('{"messages": [{"role": "user"}]}', "messages[0] needs string 'role' and 'content'"),
    ],
)
def test_bad_jsonl_line_is_named(tmp_path, line, expected):
    path = _write(tmp_path, "c.jsonl", '{"text": "fine"}\n\n' + line + "\n")
    message = _error(path)
    assert f"{path}:3:" in message and expected in message


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("empty.jsonl", "", "no samples"),
        ("blank.txt", "\n   \n\n", "no samples"),
        ("data.csv", "a,b\n", "must be a .txt or .jsonl file"),
        ("latin1.txt", "caf\xe9\n".encode("latin-1"), "not UTF-8"),
    ],
)
def test_unusable_files(tmp_path, name, content, expected):
    assert expected in _error(_write(tmp_path, name, content))


def test_missing_file(tmp_path):
    assert "calibration file not found" in _error(tmp_path / "nope.jsonl")


def test_shipped_set_is_varied():
    samples = read_calibration(DEFAULT_CALIBRATION)
    chats = [s for s in samples if s.messages]
    texts = [s for s in samples if s.text]
    assert len(samples) >= 60 and len(chats) >= 20 and len(texts) >= 20
    assert any("def " in s.text or "SELECT" in s.text for s in texts)  # some code


def test_tokenize_renders_chat_and_truncates(tiny_llama_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    path = _write(
        tmp_path,
        "c.jsonl",
        "\n".join(
            [
                json.dumps({"messages": [{"role": "user", "content": "what is the capital of france"}]}),
                json.dumps({"text": " ".join(["water"] * 50)}),
            ]
        ),
    )
    tokens = tokenize_samples(read_calibration(path), tokenizer, 16, tiny_llama_dir)
    chat, text = (b[0].tolist() for b in tokens.batches)
    # The template's own <s> ... </s>, no extra BOS from the tokenizer.
    assert tokenizer.convert_ids_to_tokens(chat) == [
        "<s>",
        "user",
        "what",
        "is",
        "the",
        "capital",
        "of",
        "france",
        "</s>",
    ]
    assert len(text) == 16 and tokens.num_truncated == 1 and tokens.num_tokens == 9 + 16


def test_messages_without_chat_template(tiny_llama_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    tokenizer.chat_template = None
    path = _write(tmp_path, "c.jsonl", '{"text": "a"}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(InputError, match=rf"{path}:2: 'messages' need a chat template"):
        tokenize_samples(read_calibration(path), tokenizer, 16, tiny_llama_dir)
