"""Client-side chat formatting with the tokenizer packaged in a repository.

The ensemble takes raw text (the same API as NVIDIA's), so a chat template is applied here,
before sending, with the exact tokenizer the server's preprocessing uses.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.embedded import hf_offline
from pipeline.errors import InputError

TOKENIZER_IN_REPO = Path("preprocessing") / "tokenizer"


def repo_tokenizer(repo: Path) -> Path:
    folder = Path(repo) / TOKENIZER_IN_REPO
    if not folder.is_dir():
        raise InputError(f"{repo}: no {TOKENIZER_IN_REPO} (not a packaged repository; run `specdeploy engine SPEC`)")
    return folder


def chat_prompt(tokenizer_dir: Path, prompt: str, system: str | None = None) -> str:
    hf_offline()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(f"{tokenizer_dir}: the tokenizer has no chat template; send raw text (--no-chat)")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # Preprocessing adds special tokens itself: a BOS written by the template would be doubled.
    bos = tokenizer.bos_token
    adds_bos = bos is not None and tokenizer("x", add_special_tokens=True).input_ids[:1] == [tokenizer.bos_token_id]
    if adds_bos and text.startswith(bos):
        text = text[len(bos):]
    return text
