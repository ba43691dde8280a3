"""Evaluation prompts: a JSONL or plain-text file (or the repository's held-out sets) -> token ids.

* JSONL (``.jsonl``): one object per line with ``"prompt"`` (raw text, tokenized as is),
  ``"messages"`` (``[{"role": ..., "content": ...}, ...]``, formatted by the model's chat template)
  or ``"input_ids"`` (token ids, already tokenized);
* any other file: plain text, one prompt per line (blank lines skipped);
* default: ``pipeline/data/prompts/chat_eval.jsonl`` (instructions, sent through the chat template
  as one user turn) and ``code_eval.jsonl`` (raw code), taken alternately.

Bad files fail with ``file:line: what is wrong`` (InputError), as specs do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "data" / "prompts"
DEFAULT_FILES = (PROMPTS_DIR / "chat_eval.jsonl", PROMPTS_DIR / "code_eval.jsonl")
CHAT_INSTRUCTIONS = PROMPTS_DIR / "chat_eval.jsonl"  # its "prompt" is a user turn, not raw text


@dataclass(frozen=True)
class Prompt:
    where: str  # file:line
    text: str | None = None  # raw text
    messages: tuple[dict[str, str], ...] | None = None  # chat turns
    input_ids: tuple[int, ...] | None = None  # already tokenized


def prompt_files(path: Path | None) -> list[Path]:
    """The files an evaluation reads (fingerprinted by the plan)."""
    return [path] if path is not None else list(DEFAULT_FILES)


def read_prompts(path: Path | None, count: int) -> list[Prompt]:
    """Up to ``count`` prompts, in file order (default sets: chat and code alternately)."""
    if path is None:
        sets = [_read(file, chat=file == CHAT_INSTRUCTIONS) for file in DEFAULT_FILES]
        mixed = [p for group in _zip_longest(sets) for p in group]
        return mixed[:count]
    prompts = _read(path, chat=False)
    if not prompts:
        raise InputError(f"{path}: no prompts in the file")
    return prompts[:count]


def _zip_longest(sets: list[list[Prompt]]) -> list[list[Prompt]]:
    longest = max(len(s) for s in sets)
    return [[s[i] for s in sets if i < len(s)] for i in range(longest)]


def _read(path: Path, chat: bool) -> list[Prompt]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: evaluation prompts not found; fix evaluation.prompts") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the evaluation prompts ({exc})") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        if path.suffix != ".jsonl":
            prompts.append(Prompt(where, text=line))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        prompts.append(_record(record, where, chat))
    return prompts


def _record(record: Any, where: str, chat: bool) -> Prompt:
    fields = [key for key in ("prompt", "messages", "input_ids") if isinstance(record, dict) and key in record]
    if len(fields) != 1:
        raise InputError(
            f'{where}: each line must be an object with one of the fields "prompt", "messages" or "input_ids"'
        )
    if "input_ids" in record:
        ids = record["input_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise InputError(f'{where}: "input_ids" must be a non-empty list of token ids (integers >= 0)')
        return Prompt(where, input_ids=tuple(ids))
    if "prompt" in record:
        text = record["prompt"]
        if not isinstance(text, str) or not text:
            raise InputError(f'{where}: "prompt" must be a non-empty string')
        return Prompt(where, messages=({"role": "user", "content": text},)) if chat else Prompt(where, text=text)
    messages = record["messages"]
    if (
        not isinstance(messages, list)
        or not messages
        or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    ):
        raise InputError(f'{where}: "messages" must be a non-empty list of {{"role": str, "content": str}}')
    return Prompt(where, messages=tuple({"role": m["role"], "content": m["content"]} for m in messages))


def needs_tokenizer(prompts: list[Prompt]) -> bool:
    return any(prompt.input_ids is None for prompt in prompts)


def encode(prompts: list[Prompt], tokenizer, vocab_size: int) -> list[list[int]]:
    """Token ids: raw text as is, chat turns through the tokenizer's chat template, ids checked."""
    out = []
    for prompt in prompts:
        if prompt.input_ids is not None:
            bad = next((i for i in prompt.input_ids if i >= vocab_size), None)
            if bad is not None:
                raise InputError(f"{prompt.where}: token id {bad} is outside the model's vocabulary [0, {vocab_size})")
            out.append(list(prompt.input_ids))
            continue
        if prompt.messages is not None:
            if not getattr(tokenizer, "chat_template", None):
                raise InputError(
                    f'{prompt.where}: "messages" need a chat template, and the model\'s tokenizer '
                    'has none; give "prompt" text instead'
                )
            text = tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True, tokenize=False)
        else:
            text = prompt.text
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if not ids:
            raise InputError(f"{prompt.where}: the prompt tokenizes to nothing")
        out.append(list(ids))
    return out
