"""Teacher-forced head-training data on fixed text: one batched forward pass of the target per sequence.

Self-distillation (:mod:`pipeline.heads.data`) lets the target answer every prompt token by token,
which costs one decoding step per training token. Here the target only reads given text: one
forward pass over each block of ``block`` tokens gives its final hidden state (after the final norm)
at every position, so a training token costs a fraction of a decoding step and millions fit the
budget. The EAGLE paper (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", Table 6) measured heads trained on a fixed dataset nearly as good as heads trained on
the target's own generations (acceptance length 3.62 vs 3.75 on MT-bench).

Labels are the target's own next-token distribution at every position, not the text's tokens
(:mod:`pipeline.heads.teacher`: distillation, as EAGLE's and Medusa-2's training); EAGLE also regresses
the target's next feature. Every position trains (``prompt_lens`` 0).

Sources (``heads.<method>.train.data``):

* ``fixed-text``: the Python standard library's source, the modules the code fine-tune trains on
  (:func:`pipeline.finetune.data.code_modules`): no module that a held-out code prompt comes from.
* a file: plain text (documents separated by blank lines) or JSONL with a ``"text"`` per line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from pipeline.errors import InputError
from pipeline.heads.data import KINDS, SeqData
from pipeline.heads.teacher import TEACHER_TOP_K, teacher_forced

BUILTIN_TEXT = "fixed-text"
Progress = Callable[[str], None]


def read_texts(path: Path) -> list[str]:
    """Documents of a training-text file (JSONL ``{"text": ...}`` or blank-line separated text)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: training text not found; give a text or JSONL file, or data: fixed-text") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the training text ({exc}); give a UTF-8 text or JSONL file") from None
    if path.suffix == ".jsonl":
        texts = []
        for number, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise InputError(f'{path}:{number}: not a JSON object; each line must be {{"text": ...}}') from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise InputError(f'{path}:{number}: each line must be a JSON object with a string "text"')
            texts.append(record["text"])
    else:
        texts = [part for part in raw.split("\n\n") if part.strip()]
    if not texts:
        raise InputError(f"{path}: no training text in the file")
    return texts


def token_blocks(tokenizer, texts: list[str], block: int, tokens: int) -> list[list[int]]:
    """Blocks of ``block`` tokens cut from ``texts`` in order, ``tokens`` in all at most (a short tail is kept
    when it holds at least a quarter block)."""
    blocks: list[list[int]] = []
    total = 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        for start in range(0, len(ids), block):
            chunk = ids[start : start + block]
            if len(chunk) < max(2, block // 4):
                continue
            chunk = chunk[: tokens - total]
            if len(chunk) < 2:
                return blocks
            blocks.append(chunk)
            total += len(chunk)
    return blocks


def builtin_blocks(tokenizer, block: int, tokens: int) -> list[list[int]]:
    """The standard library source the code fine-tune trained on, mixed across modules, deterministic."""
    from pipeline.finetune.data import _blocks, code_modules

    train_modules, _ = code_modules()
    examples = _blocks(tokenizer, train_modules, block, limit=max(1, tokens // max(1, block // 4)))
    blocks, total = [], 0
    for example in examples:
        chunk = example.input_ids[: tokens - total]
        if len(chunk) < 2:
            break
        blocks.append(chunk)
        total += len(chunk)
    return blocks


def fixed_text_data(
    model, tokenizer, source: str | Path, *, tokens: int, block: int = 256, batch: int = 8, say: Progress = print
) -> tuple[SeqData, dict]:
    """(data, meta): the target's features over ``tokens`` tokens of ``source`` (``fixed-text`` or a file)."""
    if str(source) == BUILTIN_TEXT:
        blocks, kind = builtin_blocks(tokenizer, block, tokens), "code"
    else:
        blocks, kind = token_blocks(tokenizer, read_texts(Path(source)), block, tokens), "chat"
    if not blocks:
        raise InputError(f"{source}: no block of at least {max(2, block // 4)} tokens in the training text")
    hidden, teachers = teacher_forced(model, blocks, batch=batch)
    data = SeqData.from_sequences(
        [torch.tensor(b) for b in blocks], hidden, [0] * len(blocks), [KINDS.index(kind)] * len(blocks), teachers
    )
    meta = {
        "source": str(source),
        "sequences": len(blocks),
        "tokens": int(data.tokens.numel()),
        "block": block,
        "labels": f"target top-{TEACHER_TOP_K}",
        "teacher_mass": data.teacher_mass(),
    }
    say(
        f"fixed text: {meta['sequences']} blocks, {meta['tokens']} tokens, one forward pass each; labels: the "
        f"target's top-{TEACHER_TOP_K} (mean mass {meta['teacher_mass']:.3f})"
    )
    return data, meta
