"""Prompt sets for head training and the speculative benchmark (``pipeline/data/prompts/``).

* chat: instructions written for this project (``chat_instructions.txt``), sent through the
  tokenizer's chat template.
* code: completion prompts cut from the Python standard library on this machine: a top-level
  function's ``def`` line(s) and docstring, the model writes the body. Selection is
  deterministic for a given Python version (the shipped files were made with the version
  recorded in each record's ``python`` field).

Train / held-out eval split: each prompt is ranked by sha256 of its text and the first
``EVAL_SIZE`` go to ``*_eval.jsonl`` (reused by bench/speculative.py), the rest to
``*_train.jsonl``. ``chat_instructions_extra.txt`` is training-only (``chat_train_extra.jsonl``),
so adding training prompts never changes the held-out set. Regenerate with
``python -m pipeline.heads.prompts``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import platform
import textwrap
from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "data" / "prompts"
CHAT_SOURCE = PROMPTS_DIR / "chat_instructions.txt"
CHAT_EXTRA_SOURCE = PROMPTS_DIR / "chat_instructions_extra.txt"
PARTS = ("train", "eval", "train_extra")
EVAL_SIZE = 25
CODE_TOTAL = 300  # train + eval
CODE_PER_MODULE = 10
CODE_MIN_CHARS, CODE_MAX_CHARS = 120, 700

# Pure-Python stdlib modules with documented top-level functions (sorted, de-duplicated on use).
CODE_MODULES = (
    "argparse", "ast", "base64", "bisect", "calendar", "colorsys", "configparser", "contextlib", "copy",
    "csv", "dataclasses", "datetime", "difflib", "dis", "doctest", "email.utils", "enum", "filecmp",
    "fnmatch", "fractions", "ftplib", "functools", "genericpath", "getopt", "gettext", "glob", "gzip",
    "heapq", "hmac", "html", "http.cookiejar", "imaplib", "importlib.util", "inspect", "ipaddress",
    "json", "keyword", "linecache", "locale", "logging", "mimetypes", "ntpath", "opcode", "operator",
    "optparse", "os", "pathlib", "pickle", "pkgutil", "platform", "plistlib", "posixpath", "pprint",
    "pydoc", "quopri", "random", "re", "reprlib", "runpy", "secrets", "shlex", "shutil", "site",
    "smtplib", "socket", "ssl", "statistics", "string", "subprocess", "sysconfig", "tarfile",
    "tempfile", "textwrap", "threading", "timeit", "tokenize", "traceback", "types", "typing",
    "unittest.util", "urllib.parse", "urllib.request", "uu", "uuid", "warnings", "weakref",
    "wsgiref.util", "xml.dom.minidom", "xml.sax.saxutils", "zipfile",
)


def _rank(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def split(records: list[dict], eval_size: int = EVAL_SIZE) -> tuple[list[dict], list[dict]]:
    """(train, eval): eval = the ``eval_size`` records with the smallest sha256(prompt)."""
    ranked = sorted(records, key=lambda r: _rank(r["prompt"]))
    held = {id(r) for r in ranked[:eval_size]}
    return [r for r in records if id(r) not in held], [r for r in records if id(r) in held]


def chat_records(source: Path = CHAT_SOURCE, prefix: str = "chat") -> list[dict]:
    records, category = [], "misc"
    for line in source.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            words = line[1:].strip()
            if words and len(words.split()) <= 4:  # a category heading, not a comment
                category = words
            continue
        records.append({"id": f"{prefix}-{len(records):04d}", "category": category, "prompt": line})
    return records


def _function_prompt(func) -> str | None:
    """def line(s) + docstring of a top-level function, or None when unsuitable."""
    try:
        source = textwrap.dedent(inspect.getsource(func))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.body) < 2:
        return None
    doc = node.body[0]
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
        return None
    prompt = "\n".join(source.splitlines()[:doc.end_lineno]) + "\n"
    return prompt if CODE_MIN_CHARS <= len(prompt) <= CODE_MAX_CHARS else None


def code_records(modules: tuple[str, ...] = CODE_MODULES, total: int = CODE_TOTAL) -> list[dict]:
    candidates: list[dict] = []
    for module_name in sorted(set(modules)):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found = []
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or not inspect.isfunction(obj) or obj.__module__ != module.__name__:
                continue
            prompt = _function_prompt(obj)
            if prompt is not None:
                found.append({"source": f"{module_name}.{name}", "prompt": prompt})
        found.sort(key=lambda r: _rank(r["prompt"]))  # a deterministic, unsorted-by-name sample
        candidates.extend(found[:CODE_PER_MODULE])
    candidates.sort(key=lambda r: _rank(r["source"]))
    python = platform.python_version()
    chosen = sorted(candidates[:total], key=lambda r: r["source"])
    return [{"id": f"code-{i:04d}", "python": python, **r} for i, r in enumerate(chosen)]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_prompts(kind: str, part: str, folder: Path = PROMPTS_DIR) -> list[dict]:
    """``load_prompts("chat", "eval")`` -> records with at least ``id`` and ``prompt``."""
    if kind not in ("chat", "code") or part not in PARTS or (kind, part) == ("code", "train_extra"):
        raise ValueError(f"unknown prompt set {kind}_{part}")
    return read_jsonl(folder / f"{kind}_{part}.jsonl")


def build_prompt_sets(folder: Path = PROMPTS_DIR) -> dict[str, int]:
    counts = {}
    for kind, records in (("chat", chat_records(folder / CHAT_SOURCE.name)), ("code", code_records())):
        train, held = split(records)
        write_jsonl(folder / f"{kind}_train.jsonl", train)
        write_jsonl(folder / f"{kind}_eval.jsonl", held)
        counts[f"{kind}_train"], counts[f"{kind}_eval"] = len(train), len(held)
    extra = chat_records(folder / CHAT_EXTRA_SOURCE.name, prefix="chatx")
    write_jsonl(folder / "chat_train_extra.jsonl", extra)
    counts["chat_train_extra"] = len(extra)
    return counts


if __name__ == "__main__":
    print(build_prompt_sets())
