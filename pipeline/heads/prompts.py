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

More training-only sets (:func:`build_extra_prompt_sets`, never touching the split above):

* ``code_train_extra.jsonl``: up to ``CODE_EXTRA_PER_MODULE`` more def+docstring prompts per module,
  from more stdlib modules (``CODE_EXTRA_MODULES``) and from class methods too (dedented), minus
  every prompt already in ``code_train``/``code_eval``.
* ``chat_train_more.jsonl``: templated instructions (task x topic, word problems, rewrites) from
  :mod:`pipeline.heads.chat_templates`, minus any held-out prompt.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import platform
import textwrap
from pathlib import Path

from pipeline.heads.chat_templates import stable_rank, templated_chat_prompts

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "data" / "prompts"
CHAT_SOURCE = PROMPTS_DIR / "chat_instructions.txt"
CHAT_EXTRA_SOURCE = PROMPTS_DIR / "chat_instructions_extra.txt"
PARTS = ("train", "eval", "train_extra", "train_more")
EVAL_SIZE = 25
CODE_TOTAL = 300  # train + eval
CODE_PER_MODULE = 10
CODE_MIN_CHARS, CODE_MAX_CHARS = 120, 700

# Pure-Python stdlib modules with documented top-level functions (sorted, de-duplicated on use).
CODE_MODULES = (
    "argparse",
    "ast",
    "base64",
    "bisect",
    "calendar",
    "colorsys",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "difflib",
    "dis",
    "doctest",
    "email.utils",
    "enum",
    "filecmp",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "genericpath",
    "getopt",
    "gettext",
    "glob",
    "gzip",
    "heapq",
    "hmac",
    "html",
    "http.cookiejar",
    "imaplib",
    "importlib.util",
    "inspect",
    "ipaddress",
    "json",
    "keyword",
    "linecache",
    "locale",
    "logging",
    "mimetypes",
    "ntpath",
    "opcode",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pickle",
    "pkgutil",
    "platform",
    "plistlib",
    "posixpath",
    "pprint",
    "pydoc",
    "quopri",
    "random",
    "re",
    "reprlib",
    "runpy",
    "secrets",
    "shlex",
    "shutil",
    "site",
    "smtplib",
    "socket",
    "ssl",
    "statistics",
    "string",
    "subprocess",
    "sysconfig",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "tokenize",
    "traceback",
    "types",
    "typing",
    "unittest.util",
    "urllib.parse",
    "urllib.request",
    "uu",
    "uuid",
    "warnings",
    "weakref",
    "wsgiref.util",
    "xml.dom.minidom",
    "xml.sax.saxutils",
    "zipfile",
)


CODE_EXTRA_MODULES = CODE_MODULES + (
    "asyncio.base_events",
    "asyncio.tasks",
    "asyncio.streams",
    "codecs",
    "collections",
    "concurrent.futures._base",
    "email.message",
    "email.header",
    "email.charset",
    "email.feedparser",
    "email.generator",
    "email._header_value_parser",
    "http.client",
    "http.server",
    "http.cookies",
    "json.decoder",
    "json.encoder",
    "lzma",
    "bz2",
    "mailbox",
    "multiprocessing.connection",
    "multiprocessing.pool",
    "netrc",
    "nntplib",
    "numbers",
    "poplib",
    "pstats",
    "queue",
    "sched",
    "selectors",
    "shelve",
    "smtpd",
    "sre_compile",
    "sre_parse",
    "symtable",
    "tabnanny",
    "telnetlib",
    "tomllib._parser",
    "trace",
    "turtle",
    "unittest.case",
    "unittest.mock",
    "unittest.loader",
    "urllib.robotparser",
    "wave",
    "webbrowser",
    "xml.etree.ElementTree",
    "xml.dom.pulldom",
    "xmlrpc.client",
    "zipimport",
    "aifc",
    "cgi",
    "chunk",
    "cmd",
    "code",
    "codeop",
    "compileall",
    "dbm",
    "decimal",
    "_pydecimal",
    "enum",
    "graphlib",
    "hashlib",
    "imghdr",
    "io",
    "_pyio",
    "mimetypes",
    "modulefinder",
    "pickletools",
    "py_compile",
    "pyclbr",
    "rlcompleter",
    "sndhdr",
    "stat",
    "string",
    "stringprep",
    "sunau",
    "tkinter.font",
    "tokenize",
    "zipfile",
    "concurrent.futures.process",
    "concurrent.futures.thread",
    "asyncio.locks",
    "asyncio.queues",
    "logging.handlers",
    "logging.config",
    "importlib.metadata",
    "importlib.resources._common",
    "distutils.util",
    "lib2to3.pytree",
    "ctypes.util",
    "sqlite3.dump",
    "venv",
    "zoneinfo._zoneinfo",
)
CODE_EXTRA_PER_MODULE = 24
CODE_EXTRA_TOTAL = 640


def split(records: list[dict], eval_size: int = EVAL_SIZE) -> tuple[list[dict], list[dict]]:
    """(train, eval): eval = the ``eval_size`` records with the smallest sha256(prompt)."""
    ranked = sorted(records, key=lambda r: stable_rank(r["prompt"]))
    held = {id(r) for r in ranked[:eval_size]}
    return [r for r in records if id(r) not in held], [r for r in records if id(r) in held]


def chat_records(source: Path = CHAT_SOURCE, prefix: str = "chat") -> list[dict]:
    records: list[dict] = []
    category = "misc"
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
    prompt = "\n".join(source.splitlines()[: doc.end_lineno]) + "\n"
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
        found.sort(key=lambda r: stable_rank(r["prompt"]))  # a deterministic, unsorted-by-name sample
        candidates.extend(found[:CODE_PER_MODULE])
    candidates.sort(key=lambda r: stable_rank(r["source"]))
    python = platform.python_version()
    chosen = sorted(candidates[:total], key=lambda r: r["source"])
    return [{"id": f"code-{i:04d}", "python": python, **r} for i, r in enumerate(chosen)]


def _method_candidates(module) -> list[dict]:
    """def+docstring prompts of top-level functions and of methods of top-level classes."""
    found = []
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") and not name.startswith("__"):
            if not inspect.isclass(obj):
                continue
        if inspect.isfunction(obj) and obj.__module__ == module.__name__ and not name.startswith("_"):
            prompt = _function_prompt(obj)
            if prompt is not None:
                found.append({"source": f"{module.__name__}.{name}", "prompt": prompt})
        elif inspect.isclass(obj) and obj.__module__ == module.__name__:
            for attr, member in sorted(vars(obj).items()):
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if not inspect.isfunction(member) or (attr.startswith("_") and attr != "__init__"):
                    continue
                prompt = _function_prompt(member)
                if prompt is not None:
                    found.append({"source": f"{module.__name__}.{name}.{attr}", "prompt": prompt})
    return found


def code_extra_records(
    exclude: set[str],
    modules: tuple[str, ...] = CODE_EXTRA_MODULES,
    per_module: int = CODE_EXTRA_PER_MODULE,
    total: int = CODE_EXTRA_TOTAL,
) -> list[dict]:
    """Training-only code prompts (functions and methods), none of whose text is in ``exclude``."""
    import warnings

    candidates: list[dict] = []
    for module_name in sorted(set(modules)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - optional / platform-specific modules
            continue
        found = [r for r in _method_candidates(module) if r["prompt"] not in exclude]
        found.sort(key=lambda r: stable_rank(r["prompt"]))
        candidates.extend(found[:per_module])
    seen, unique = set(exclude), []
    for r in sorted(candidates, key=lambda r: stable_rank(r["source"])):
        if r["prompt"] not in seen:
            seen.add(r["prompt"])
            unique.append(r)
    python = platform.python_version()
    chosen = sorted(unique[:total], key=lambda r: r["source"])
    return [{"id": f"codex-{i:04d}", "python": python, **r} for i, r in enumerate(chosen)]


def chat_more_records(exclude: set[str]) -> list[dict]:
    kept = [(c, p) for c, p in templated_chat_prompts() if p not in exclude]
    return [{"id": f"chatm-{i:04d}", "category": c, "prompt": p} for i, (c, p) in enumerate(kept)]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_prompts(kind: str, part: str, folder: Path = PROMPTS_DIR) -> list[dict]:
    """``load_prompts("chat", "eval")`` -> records with at least ``id`` and ``prompt``."""
    if kind not in ("chat", "code") or part not in PARTS or (kind, part) == ("code", "train_more"):
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


def build_extra_prompt_sets(folder: Path = PROMPTS_DIR) -> dict[str, int]:
    """Writes code_train_extra.jsonl and chat_train_more.jsonl (training only, disjoint from the rest)."""

    def texts(*names: str) -> set[str]:
        return {r["prompt"] for n in names if (folder / n).exists() for r in read_jsonl(folder / n)}

    code = code_extra_records(texts("code_train.jsonl", "code_eval.jsonl"))
    chat = chat_more_records(texts("chat_train.jsonl", "chat_eval.jsonl", "chat_train_extra.jsonl"))
    write_jsonl(folder / "code_train_extra.jsonl", code)
    write_jsonl(folder / "chat_train_more.jsonl", chat)
    return {"code_train_extra": len(code), "chat_train_more": len(chat)}


if __name__ == "__main__":
    import sys

    print(build_extra_prompt_sets() if "--extra" in sys.argv[1:] else build_prompt_sets())
