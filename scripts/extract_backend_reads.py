"""Extract the ``tensorrt_llm`` model's parameter reads from NVIDIA's C++ Triton backend.

Reads ``model_instance_state.cc`` and ``model_state.cc`` of the TensorRT-LLM Triton backend
(``inflight_batcher_llm/src/``: NVIDIA/TensorRT-LLM ``triton_backend/``, or
triton-inference-server/tensorrtllm_backend before May 2025) and prints, as JSON, one row per
``GetParameter<T>(...)`` call:

- ``key`` and ``type`` (the C++ template argument);
- ``function`` and ``line`` where it is read;
- ``required``: true when a missing key ends the model's load: the read is outside every ``try``
  of its function, or inside one whose ``catch`` throws again or returns an error to Triton, and
  every caller of the function calls it outside a forgiving ``try`` too;
- ``condition``: the ``if (...)`` conditions around the read (``null``: always read);
- ``choices``: for a string, the literals its value is compared with (the values it acts on);
- ``placeholder``: the function compares the value to the unfilled template text ``${key}``
  (which it then treats as unset, as it does an empty string).

Usage (the sources are not part of this repository; point the script at a checkout)::

    python scripts/extract_backend_reads.py SRC_DIR --repository NVIDIA/TensorRT-LLM --commit SHA \
        --path triton_backend/inflight_batcher_llm/src > pipeline/triton/backend_reads.json

The output is what ``pipeline/triton/backend_reads.json`` holds; ``tests/triton/test_backend_reads.py``
checks every config.pbtxt specdeploy writes against it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

FILES = ("model_instance_state.cc", "model_state.cc")
READ = re.compile(r"GetParameter<\s*([\w:<>\s]+?)\s*>\s*\(\s*(\"(?P<key>[^\"]+)\"|(?P<var>\w+))\s*\)")
FUNCTION = re.compile(r"^(?:[A-Za-z][^;{}()\n]*?\s)?(\w+)::(\w+)\s*\(", re.M)
# A catch that ends the load: it throws again, or returns an error to Triton.
FATAL = re.compile(r"\bthrow\b|\bTLLM_THROW\b|\bTRITONSERVER_ErrorNew\b")


def strip_comments(text: str) -> str:
    """Comments blanked (line structure kept), string literals left alone."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def match_brace(text: str, open_at: int) -> int:
    """The index of the ``}`` closing the ``{`` at ``open_at`` (string literals skipped)."""
    depth, i = 0, open_at
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError("unbalanced braces")


@dataclass
class Block:
    kind: str  # "try", "catch", "if", "else", "other"
    start: int
    end: int
    head: str = ""  # the if condition
    catch_throws: bool = False  # a try block: its catch throws again


@dataclass
class Function:
    cls: str
    name: str
    start: int
    end: int
    blocks: list[Block] = field(default_factory=list)


def parse_functions(text: str) -> list[Function]:
    functions = []
    for m in FUNCTION.finditer(text):
        brace = text.find("{", m.end())
        semi = text.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            continue  # a declaration, not a definition
        end = match_brace(text, brace)
        fn = Function(m.group(1), m.group(2), brace, end)
        fn.blocks = parse_blocks(text, brace + 1, end)
        functions.append(fn)
    return functions


def parse_blocks(text: str, start: int, end: int) -> list[Block]:
    """Every braced block inside [start, end), kind from what precedes its ``{``."""
    blocks: list[Block] = []
    i = start
    while i < end:
        if text[i] == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif text[i] == "{":
            close = match_brace(text, i)
            before = text[max(start, i - 400) : i].rstrip()
            kind, head = "other", ""
            if before.endswith("try"):
                kind = "try"
            elif re.search(r"\bcatch\s*\([^)]*\)$", before):
                kind = "catch"
            elif before.endswith("else"):
                kind = "else"
            else:
                cond = _trailing_condition(before)
                if cond is not None:
                    kind, head = "if", cond
            blocks.append(Block(kind, i, close, head))
            i += 1
            continue
        i += 1
    for index, block in enumerate(blocks):  # pair each try with the catch right after it
        if block.kind == "try":
            for later in blocks[index + 1 :]:
                if later.kind == "catch" and later.start > block.end:
                    block.catch_throws = bool(FATAL.search(text[later.start : later.end]))
                    break
    return blocks


def _trailing_condition(before: str) -> str | None:
    """The condition of ``if (...)`` that ``before`` ends with, or None."""
    if not before.endswith(")"):
        return None
    depth = 0
    for j in range(len(before) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(before[j], 0)
        if depth == 0:
            keyword = before[:j].rstrip()
            if keyword.endswith("if") and not keyword.endswith("elif"):
                return " ".join(before[j + 1 : -1].split())
            return None
    return None


def enclosing(fn: Function, at: int) -> list[Block]:
    return [b for b in fn.blocks if b.start < at < b.end]


def forgiven(blocks: list[Block]) -> bool:
    """Inside a try whose catch falls back instead of throwing."""
    return any(b.kind == "try" and not b.catch_throws for b in blocks)


def callers_forgive(name: str, sources: dict[str, tuple[str, list[Function]]]) -> bool:
    """Every call of ``name()`` sits inside a forgiving try (None of them: not forgiven)."""
    calls = []
    for text, functions in sources.values():
        for m in re.finditer(rf"(?<![\w:]){name}\s*\(", text):
            fn = next((f for f in functions if f.start < m.start() < f.end), None)
            if fn is not None and fn.name != name:
                calls.append(forgiven(enclosing(fn, m.start())))
    return bool(calls) and all(calls)


def resolve_variable(text: str, fn: Function, var: str, at: int) -> str | None:
    """The last string literal assigned to ``var`` before ``at`` in ``fn``."""
    found = None
    for m in re.finditer(rf"\b{var}\s*=\s*\"([^\"]+)\"", text[fn.start : at]):
        found = m.group(1)
    return found


def _compared_literals(text: str, fn: Function, read: re.Match[str]) -> list[str]:
    """The string literals a string read's variable is compared with (``x == "top_k"``), the values
    the backend acts on; the unfilled ``${...}`` placeholder is not one of them."""
    assigned = re.search(r"(\w+)\s*=\s*[\w>.-]*$", text[max(fn.start, read.start() - 120) : read.start()])
    if assigned is None:
        return []
    var = assigned.group(1)
    found = re.findall(rf"\b{var}\s*==\s*\"([^\"]*)\"", text[read.end() : fn.end])
    return sorted({value for value in found if not value.startswith("${")})


def extract(src: Path) -> list[dict]:
    sources = {}
    for name in FILES:
        text = strip_comments((src / name).read_text())
        sources[name] = (text, parse_functions(text))
    rows = []
    for file, (text, functions) in sources.items():
        for m in READ.finditer(text):
            fn = next((f for f in functions if f.start < m.start() < f.end), None)
            if fn is None or fn.name == "GetParameter":
                continue  # the template specialisations themselves
            key = m.group("key") or resolve_variable(text, fn, m.group("var"), m.start())
            if key is None:
                raise SystemExit(f"{file}:{fn.name}: GetParameter({m.group('var')}) with no literal name")
            blocks = enclosing(fn, m.start())
            required = not forgiven(blocks) and not callers_forgive(fn.name, sources)
            conditions = [b.head for b in blocks if b.kind == "if"]
            body = text[fn.start : fn.end]
            choices = _compared_literals(text, fn, m) if m.group(1).strip() == "std::string" else []
            rows.append(
                {
                    "key": key,
                    "type": " ".join(m.group(1).split()),
                    "file": file,
                    "line": text.count("\n", 0, m.start()) + 1,
                    "function": f"{fn.cls}::{fn.name}",
                    "required": required,
                    "condition": " && ".join(conditions) or None,
                    "placeholder": f'"${{{key}}}"' in body,
                    "choices": choices or None,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="the backend's src/ folder (model_instance_state.cc, model_state.cc)")
    parser.add_argument("--repository", required=True, help="owner/name the sources were read from")
    parser.add_argument("--commit", required=True, help="the commit they were read at")
    parser.add_argument("--path", required=True, help="the src/ folder's path inside that repository")
    args = parser.parse_args(argv)
    source = {"repository": args.repository, "commit": args.commit, "path": args.path, "files": list(FILES)}
    rows = ",\n".join("  " + json.dumps(row) for row in extract(args.src))  # one read a line: diffs stay readable
    sys.stdout.write(f'{{\n "source": {json.dumps(source)},\n "reads": [\n{rows}\n ]\n}}\n')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
