"""Calibration text for FP8 PTQ: reading ``.txt`` / ``.jsonl`` files and tokenizing them.

File formats:

* ``.jsonl``: one JSON object per non-blank line, with either ``"text": "<string>"`` or
  ``"messages": [{"role": ..., "content": ...}, ...]``. Messages are rendered with the
  model's own chat template, so calibration sees the same special tokens as serving.
* ``.txt``: if the file has any blank line, each blank-line-separated paragraph is one
  sample (multi-line code and prose stay whole); otherwise each non-empty line is one
  sample (the common "one sentence per line" corpus).

Samples are used in file order; the first ``calib_size`` are taken (all of them when
the file has fewer). Each sample is tokenized on its own and cut to ``calib_max_len``
tokens; calibration runs them one at a time, or batches samples of equal length
(``batch_equal_lengths``), so no padding tokens ever reach the activation ranges (amax).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import InputError

if TYPE_CHECKING:
    import torch

DEFAULT_CALIBRATION = Path(__file__).resolve().parent.parent / "data" / "calibration.jsonl"
SUFFIXES = (".txt", ".jsonl")


@dataclass(frozen=True)
class CalibrationSample:
    where: str  # "file:line", for error messages
    text: str | None = None
    messages: tuple[dict[str, str], ...] | None = None


def read_calibration(path: Path) -> list[CalibrationSample]:
    """All samples of a calibration file; InputError (one line, naming the line) when malformed."""
    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"{path}: calibration file not found; point quantization.calibration.data "
            f"at a .txt or .jsonl file, or leave it unset for the shipped set"
        )
    if path.suffix not in SUFFIXES:
        raise InputError(f"{path}: calibration data must be a .txt or .jsonl file (got '{path.suffix}')")
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}); re-save it as UTF-8") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    samples = _parse_jsonl(path, content) if path.suffix == ".jsonl" else _parse_txt(path, content)
    if not samples:
        raise InputError(f"{path}: calibration file has no samples; add text (see the .txt/.jsonl formats)")
    return samples


def _parse_txt(path: Path, content: str) -> list[CalibrationSample]:
    lines = content.splitlines()
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if not filled:
        return []
    # Blank lines before the first or after the last text do not make it a paragraph file.
    if all(line.strip() for line in lines[filled[0] : filled[-1] + 1]):
        return [CalibrationSample(f"{path}:{i + 1}", text=lines[i].strip()) for i in filled]
    samples: list[CalibrationSample] = []
    block: list[str] = []
    start = 0
    for n, line in enumerate([*lines, ""], 1):
        if line.strip():
            if not block:
                start = n
            block.append(line.rstrip())
        elif block:
            samples.append(CalibrationSample(f"{path}:{start}", text="\n".join(block)))
            block = []
    return samples


def _parse_jsonl(path: Path, content: str) -> list[CalibrationSample]:
    samples = []
    for n, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            msg = getattr(exc, "msg", str(exc))
            raise InputError(
                f"{where}: not valid JSON ({msg}); each line must be one object with 'text' or 'messages'"
            ) from None
        samples.append(_sample_from_record(where, record))
    return samples


def _sample_from_record(where: str, record: Any) -> CalibrationSample:
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object with 'text' or 'messages', got {type(record).__name__}")
    if "text" in record:
        text = record["text"]
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"{where}: 'text' must be a non-empty string")
        return CalibrationSample(where, text=text)
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise InputError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
        for i, message in enumerate(messages):
            if not (
                isinstance(message, dict)
                and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)
            ):
                raise InputError(f"{where}: messages[{i}] needs string 'role' and 'content'")
        return CalibrationSample(where, messages=tuple({"role": m["role"], "content": m["content"]} for m in messages))
    keys = ", ".join(sorted(record)) or "none"
    raise InputError(f"{where}: needs a 'text' string or a 'messages' list (keys found: {keys})")


@dataclass(frozen=True)
class TokenizedCalibration:
    batches: list[torch.Tensor]  # [1, n] input_ids each
    num_tokens: int
    num_truncated: int


def tokenize_samples(
    samples: list[CalibrationSample], tokenizer: Any, max_len: int, model_dir: Path
) -> TokenizedCalibration:
    """Render chat samples with the tokenizer's template and tokenize, one sample per batch."""
    import torch

    batches: list[torch.Tensor] = []
    truncated = 0
    for sample in samples:
        if sample.messages is not None:
            if not getattr(tokenizer, "chat_template", None):
                raise InputError(
                    f"{sample.where}: 'messages' need a chat template, but the tokenizer in "
                    f"{model_dir} has none; use 'text' samples instead"
                )
            try:
                text = tokenizer.apply_chat_template(list(sample.messages), tokenize=False)
            except Exception as exc:  # jinja raises its own types, e.g. "roles must alternate"
                raise InputError(
                    f"{sample.where}: the chat template of {model_dir} rejects these messages ({exc})"
                ) from None
            # The template already wrote BOS/special tokens; adding them again would double BOS.
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(sample.text)["input_ids"]
        if not ids:
            raise InputError(f"{sample.where}: sample tokenizes to zero tokens")
        if len(ids) > max_len:
            ids = ids[:max_len]
            truncated += 1
        batches.append(torch.tensor([ids], dtype=torch.long))
    return TokenizedCalibration(batches, sum(int(b.shape[1]) for b in batches), truncated)


def batch_equal_lengths(batches: list[torch.Tensor], size: int) -> list[torch.Tensor]:
    """Stack up to ``size`` samples of the same length into one [b, n] forward (no padding);
    samples keep their order within a length. ``size`` 1 returns the samples as they are."""
    if size <= 1:
        return list(batches)
    import torch

    by_length: dict[int, list[torch.Tensor]] = {}
    for ids in batches:
        by_length.setdefault(int(ids.shape[1]), []).append(ids)
    stacked = []
    for group in by_length.values():
        for start in range(0, len(group), size):
            stacked.append(torch.cat(group[start : start + size], dim=0))
    return stacked
