"""Extract the PyTorch-backend rules specdeploy plans against from TensorRT-LLM's sources.

TensorRT-LLM is not installed (nor importable) here: every file is read as text at a git ref and
Python is parsed with :mod:`ast`, never imported. For each ref the script records:

- ``speculative_configs``: the decoding config classes of ``tensorrt_llm/llmapi/llm_args.py``
  (every subclass of ``DecodingBaseConfig`` with its ``decoding_type``), and for the ones specdeploy
  may use (EAGLE-3, or EAGLE where no ``Eagle3`` class exists; NGram; draft/target; MTP) each field:
  name, annotation text, default (or required), aliases, status and a short description, including
  the fields inherited from ``DecodingBaseConfig``;
- ``kv_cache_config``: the fields of ``KvCacheConfig``;
- ``lora_config``: the class named by the ``lora_config`` argument (found by following the imports
  of ``llm_args.py``: ``lora_helper.py``, ``lora_manager.py`` or ``_torch/peft/lora/config.py``) and
  its fields;
- ``llm_args``: the top-level ``LLM()`` arguments specdeploy sets, on ``TorchLlmArgs`` (inherited
  fields included), with the config classes ``speculative_config`` accepts;
- ``llmapi_model_yaml``: the keys of Triton's ``llmapi`` model (``model.yaml``) and whether its
  ``model.py`` passes a ``lora_request`` to ``generate_async``;
- ``feature_matrix``: the LoRA x speculative decoding and pipeline parallelism x speculative
  decoding cells of ``docs/source/features/feature-combination-matrix.md``;
- ``eagle3_drafter``: the drafter ``config.json`` keys ``modeling_speculative.py`` reads (with line
  numbers) and the architecture names it registers;
- ``files``: the git blob sha of every file read (``null``: absent at that ref).

A top-level ``differences`` list says what changed between the first ref and each later one.

Usage (the sources are not part of this repository; point the script at a git mirror or checkout)::

    python scripts/extract_llm_api_rules.py TRTLLM_GIT_DIR --ref v1.2.1 --ref newest \
        -o pipeline/targets/pytorch_rules.json

``newest`` stands for the newest release or release-candidate tag (``vX.Y.Z`` or ``vX.Y.ZrcN``) in
the repository. A plain directory without git works too, with one ``--ref`` label and ``--commit``.
Only field names, annotations, defaults and descriptions cut to a short length are recorded.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

REPOSITORY = "NVIDIA/TensorRT-LLM"
LLM_ARGS = "tensorrt_llm/llmapi/llm_args.py"
LLMAPI_MODEL_YAML = "triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml"
LLMAPI_MODEL_PY = "triton_backend/all_models/llmapi/tensorrt_llm/1/model.py"
FEATURE_MATRIX = "docs/source/features/feature-combination-matrix.md"
MODELING_SPECULATIVE = "tensorrt_llm/_torch/models/modeling_speculative.py"

DECODING_BASE = "DecodingBaseConfig"
# Each role specdeploy may use: the decoding_type strings that name it, then class names to fall back on.
ROLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "eagle3": (("Eagle3",), ("Eagle3DecodingConfig",)),
    "eagle": (("Eagle",), ("EagleDecodingConfig",)),
    "ngram": (("NGram",), ("NGramDecodingConfig",)),
    "draft_target": (("Draft_Target", "DraftTarget"), ("DraftTargetDecodingConfig",)),
    "mtp": (("MTP",), ("MTPDecodingConfig",)),
}
LLM_ARGS_CLASSES = ("TorchLlmArgs", "LlmArgs", "BaseLlmArgs")
LLM_ARG_FIELDS = (
    "model",
    "tokenizer",
    "backend",
    "dtype",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "context_parallel_size",
    "moe_expert_parallel_size",
    "max_batch_size",
    "max_num_tokens",
    "max_seq_len",
    "max_input_len",
    "max_beam_width",
    "kv_cache_config",
    "speculative_config",
    "lora_config",
    "enable_lora",
    "peft_cache_config",
    "cuda_graph_config",
    "enable_chunked_prefill",
)
FIELD_CALLS = {"Field", "PydanticField", "field"}
ALIAS_KEYWORDS = ("alias", "validation_alias", "serialization_alias")
REGISTRIES = ("register_auto_model", "register_draft_model")
MAX_DESCRIPTION = 300
MAX_LINE_TEXT = 160
VERSION_TAG = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:rc(\d+))?(?:\.post(\d+))?$")

# Feature-matrix labels, matched case-insensitively against row and column headings.
TOPICS = {
    "lora": re.compile(r"\blora\b", re.I),
    "speculative": re.compile(r"specul|eagle|\bmtp\b|ngram|draft|dynamic tree|legacy path|user.provided", re.I),
    "pipeline_parallel": re.compile(r"pipeline|\bpp\b", re.I),
}
PAIRS = (("lora", "speculative"), ("pipeline_parallel", "speculative"))


# -- reading files at a ref --------------------------------------------------------------------------


class Tree(Protocol):
    """Files of one source tree at one commit."""

    commit: str

    def read(self, path: str) -> str | None:
        """The text of ``path``, or None when the tree has no such file."""

    def blob_sha(self, path: str) -> str | None:
        """The git blob sha of ``path``, or None when the tree has no such file."""


def git_blob_sha(data: bytes) -> str:
    """The sha git gives a blob of these bytes (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class DirTree:
    """A plain directory (no git): the commit is whatever the caller says it is."""

    root: Path
    commit: str

    def read(self, path: str) -> str | None:
        file = self.root / path
        return file.read_text(encoding="utf-8") if file.is_file() else None

    def blob_sha(self, path: str) -> str | None:
        file = self.root / path
        return git_blob_sha(file.read_bytes()) if file.is_file() else None


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` (a bare mirror or a checkout) and return its stripped stdout."""
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LookupError(done.stderr.strip() or f"git {' '.join(args)} failed")
    return done.stdout.strip()


@dataclass
class GitTree:
    """One commit of a git repository, read with ``git cat-file`` (no work tree needed)."""

    repo: Path
    commit: str

    def blob_sha(self, path: str) -> str | None:
        try:
            sha = git(self.repo, "rev-parse", "--verify", "--quiet", f"{self.commit}:{path}")
        except LookupError:
            return None
        return sha if git(self.repo, "cat-file", "-t", sha) == "blob" else None

    def read(self, path: str) -> str | None:
        sha = self.blob_sha(path)
        if sha is None:
            return None
        done = subprocess.run(["git", "-C", str(self.repo), "cat-file", "blob", sha], capture_output=True, check=True)
        return done.stdout.decode("utf-8")


def is_git_repository(path: Path) -> bool:
    """Whether ``path`` is the top of a git repository: a bare mirror, or a checkout's work tree.

    A folder inside some other checkout is not one (its files are not at the repository's root).
    """
    try:
        if git(path, "rev-parse", "--is-bare-repository") == "true":
            return True
        return Path(git(path, "rev-parse", "--show-toplevel")).resolve() == path.resolve()
    except (LookupError, FileNotFoundError, NotADirectoryError):
        return False


def version_key(tag: str) -> tuple[int, ...] | None:
    """A sort key for a release (``v1.2.1``) or release-candidate (``v1.3.0rc4``) tag; None for others.

    A release sorts after all of its release candidates, a ``.postN`` after what it follows.
    """
    found = VERSION_TAG.match(tag)
    if found is None:
        return None
    major, minor, patch, rc, post = found.groups()
    candidate = (0, int(rc)) if rc is not None else (1, 0)
    return (int(major), int(minor), int(patch), *candidate, int(post or 0))


def newest_version_tag(tags: Iterable[str]) -> str | None:
    """The newest release or release-candidate tag among ``tags`` (None when there is none)."""
    versioned = [(key, tag) for tag in tags if (key := version_key(tag)) is not None]
    return max(versioned)[1] if versioned else None


def resolve_ref(repo: Path, ref: str) -> tuple[str, str, str | None]:
    """``(tag or ref, commit, note)`` for ``ref``; ``newest`` picks the newest version tag."""
    note = None
    if ref == "newest":
        tags = git(repo, "tag", "--list").split()
        found = newest_version_tag(tags)
        if found is None:
            raise LookupError(f"{repo}: no release or release-candidate tag")
        note = f"newest of {sum(version_key(t) is not None for t in tags)} release/rc tags"
        ref = found
    return ref, git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}"), note


# -- Python sources: classes and fields --------------------------------------------------------------


def text(node: ast.AST | None) -> str | None:
    """The source text of ``node`` as ``ast.unparse`` writes it."""
    return None if node is None else ast.unparse(node)


def string_value(node: ast.AST | None) -> str | None:
    """The value of a string literal (implicit or ``+`` concatenations included); None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = string_value(node.left), string_value(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def short(description: str | None, limit: int = MAX_DESCRIPTION) -> str | None:
    """One line of at most ``limit`` characters (whitespace collapsed, cut with an ellipsis)."""
    if description is None:
        return None
    flat = " ".join(description.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def literal(node: ast.AST) -> tuple[bool, Any]:
    """``(True, value)`` for a literal JSON can hold (tuples and sets become lists), else ``(False, None)``."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None

    def plain(item: Any) -> Any:
        if isinstance(item, (tuple, list)):
            return [plain(i) for i in item]
        if isinstance(item, (set, frozenset)):
            return sorted((plain(i) for i in item), key=repr)
        if isinstance(item, dict):
            return {str(k): plain(v) for k, v in item.items()}
        if item is None or isinstance(item, (bool, int, float, str)):
            return item
        raise TypeError(type(item).__name__)

    try:
        return True, plain(value)
    except TypeError:
        return False, None


def is_classvar(annotation: ast.AST) -> bool:
    """Whether an annotation is ``ClassVar`` or ``ClassVar[...]`` (not a model field)."""
    target = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return (text(target) or "").split(".")[-1] == "ClassVar"


def field_call(node: ast.AST | None) -> ast.Call | None:
    """The ``Field(...)`` / ``PydanticField(...)`` / dataclass ``field(...)`` call ``node`` is, if any."""
    if isinstance(node, ast.Call) and (text(node.func) or "").split(".")[-1] in FIELD_CALLS:
        return node
    return None


def aliases_of(call: ast.Call) -> list[str]:
    """The alias names a ``Field`` accepts (``alias=``, ``validation_alias=AliasChoices(...)``...)."""
    names: list[str] = []
    for keyword in call.keywords:
        if keyword.arg in ALIAS_KEYWORDS:
            for node in ast.walk(keyword.value):
                value = string_value(node)
                if value is not None and value not in names:
                    names.append(value)
    return names


def field_record(owner: str, target: str, annotation: ast.AST | None, value: ast.AST | None, line: int) -> dict:
    """One field: annotation, default (``required`` when none), aliases, status and description."""
    record: dict[str, Any] = {"name": target, "annotation": text(annotation), "defined_in": owner, "line": line}
    default: ast.AST | None = value
    call = field_call(value)
    if call is not None:
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        default = call.args[0] if call.args else keywords.get("default")
        if "default_factory" in keywords:
            record["default_factory"] = text(keywords["default_factory"])
        description = keywords.get("description")
        if description is not None:
            record["description"] = short(string_value(description) or text(description))
        status = string_value(keywords.get("status"))
        if status is not None:
            record["status"] = status
        if "deprecated" in keywords:
            record["deprecated"] = text(keywords["deprecated"])
        aliases = aliases_of(call)
        if aliases:
            record["aliases"] = aliases
    required = "default_factory" not in record and (
        default is None or (isinstance(default, ast.Constant) and default.value is Ellipsis)
    )
    record["required"] = required
    if not required and default is not None:
        ok, value_ = literal(default)
        if ok:
            record["default"] = value_
        else:
            record["default_expr"] = text(default)
    return record


def top_level(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a module or class body, looking into ``if``/``try`` blocks (not into defs)."""
    for statement in statements:
        yield statement
        if isinstance(statement, ast.If):
            yield from top_level(statement.body)
            yield from top_level(statement.orelse)
        elif isinstance(statement, ast.Try):
            for block in (statement.body, statement.orelse, statement.finalbody):
                yield from top_level(block)
            for handler in statement.handlers:
                yield from top_level(handler.body)


@dataclass
class ClassInfo:
    """A class of a parsed module: its bases, fields and ``decoding_type``."""

    name: str
    path: str
    line: int
    bases: list[str]
    decorators: list[str]
    fields: list[dict]
    decoding_type: str | None
    decoding_type_source: str | None


def decoding_type_of(statement: ast.stmt) -> tuple[str | None, str | None]:
    """``(value, how)`` when ``statement`` sets ``decoding_type`` (a string, or a one-value Literal)."""
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        if statement.target.id != "decoding_type":
            return None, None
        value = string_value(statement.value)
        call = field_call(statement.value)
        if call is not None:
            value = string_value(call.args[0] if call.args else None) or next(
                (string_value(k.value) for k in call.keywords if k.arg == "default"), None
            )
        if value is not None:
            return value, "class attribute"
        annotation = statement.annotation
        if isinstance(annotation, ast.Subscript) and (text(annotation.value) or "").endswith("Literal"):
            values = [string_value(n) for n in ast.walk(annotation.slice)]
            first = next((v for v in values if v is not None), None)
            return first, "Literal annotation" if first else None
        return None, None
    if isinstance(statement, ast.Assign):
        names = [t.id for t in statement.targets if isinstance(t, ast.Name)]
        if "decoding_type" in names and string_value(statement.value) is not None:
            return string_value(statement.value), "class attribute"
    return None, None


def parse_class(node: ast.ClassDef, path: str) -> ClassInfo:
    """The fields a class defines itself (pydantic or dataclass style; ``_private`` and ClassVars skipped)."""
    fields: list[dict] = []
    decoding_type, source = None, None
    for statement in top_level(node.body):
        found, how = decoding_type_of(statement)
        if found is not None:
            decoding_type, source = found, how
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        name = statement.target.id
        if name.startswith("_") or name == "model_config" or is_classvar(statement.annotation):
            continue
        fields.append(field_record(node.name, name, statement.annotation, statement.value, statement.lineno))
    return ClassInfo(
        name=node.name,
        path=path,
        line=node.lineno,
        bases=[text(b) or "" for b in node.bases],
        decorators=[text(d) or "" for d in node.decorator_list],
        fields=fields,
        decoding_type=decoding_type,
        decoding_type_source=source,
    )


@dataclass
class Module:
    """A parsed Python file: its classes, module-level assignments and ``from`` imports."""

    path: str
    tree: ast.Module
    classes: dict[str, ClassInfo]
    assignments: dict[str, ast.AST]
    imports: dict[str, tuple[str, int, str]]  # local name -> (module, level, imported name)


def parse_module(source: str, path: str) -> Module:
    """Parse ``source`` (never imported) into a :class:`Module`."""
    tree = ast.parse(source, filename=path)
    classes: dict[str, ClassInfo] = {}
    assignments: dict[str, ast.AST] = {}
    imports: dict[str, tuple[str, int, str]] = {}
    for statement in top_level(tree.body):
        if isinstance(statement, ast.ClassDef):
            classes.setdefault(statement.name, parse_class(statement, path))
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            if isinstance(target, ast.Name):
                assignments[target.id] = statement.value
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.value:
            assignments[statement.target.id] = statement.value
        elif isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                imports[alias.asname or alias.name] = (statement.module or "", statement.level, alias.name)
    return Module(path=path, tree=tree, classes=classes, assignments=assignments, imports=imports)


def module_paths(importer: str, module: str, level: int) -> list[str]:
    """Candidate file paths of ``from <level dots><module> import ...`` written in file ``importer``."""
    if level:
        package = Path(importer).parent
        for _ in range(level - 1):
            package = package.parent
        base = package.joinpath(*module.split(".")) if module else package
    else:
        base = Path(*module.split("."))
    return [f"{base.as_posix()}.py", f"{base.as_posix()}/__init__.py"]


def locate_class(tree: Tree, module: Module, name: str, depth: int = 3) -> ClassInfo | None:
    """The class ``name`` as ``module`` sees it: defined there, or followed through its imports."""
    if name in module.classes:
        return module.classes[name]
    if depth == 0 or name not in module.imports:
        return None
    source_module, level, imported = module.imports[name]
    for path in module_paths(module.path, source_module, level):
        source = tree.read(path)
        if source is not None:
            return locate_class(tree, parse_module(source, path), imported, depth - 1)
    return None


def lineage(module: Module, name: str) -> list[str]:
    """``name`` and its ancestors defined in ``module``, nearest first (depth first, left to right)."""
    seen: list[str] = []

    def visit(current: str) -> None:
        if current in seen or current not in module.classes:
            return
        seen.append(current)
        for base in module.classes[current].bases:
            visit(base.split("[")[0].split(".")[-1])

    visit(name)
    return seen


def all_fields(module: Module, name: str) -> list[dict]:
    """The fields of class ``name`` with those it inherits (a subclass's own definition wins)."""
    merged: dict[str, dict] = {}
    for ancestor in reversed(lineage(module, name)):
        for record in module.classes[ancestor].fields:
            merged.pop(record["name"], None)
            merged[record["name"]] = record
    return list(merged.values())


def class_summary(info: ClassInfo, fields: list[dict]) -> dict:
    """The JSON form of a class and its (already merged) fields."""
    return {
        "class": info.name,
        "file": info.path,
        "line": info.line,
        "bases": info.bases,
        "dataclass": any(d.split("(")[0].split(".")[-1] == "dataclass" for d in info.decorators),
        "fields": fields,
    }


def expand_aliases(node: ast.AST, assignments: dict[str, ast.AST], depth: int = 4) -> ast.AST:
    """``node`` with module-level type aliases (``SpeculativeConfig = Union[...]``) written out."""

    class Expand(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> ast.AST:
            if depth > 0 and name.id in assignments:
                return expand_aliases(copy.deepcopy(assignments[name.id]), assignments, depth - 1)
            return name

    return Expand().visit(copy.deepcopy(node))


def names_in(node: ast.AST) -> list[str]:
    """The bare names in an expression (forward references included), in order, once each."""
    found: list[str] = []
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and child.id not in found:
            found.append(child.id)
        elif isinstance(child, ast.Attribute) and child.attr not in found:
            found.append(child.attr)
        elif (forward := string_value(child)) is not None:  # a forward reference: Optional["LoraConfig"]
            try:
                found += [n for n in names_in(ast.parse(forward, mode="eval").body) if n not in found]
            except SyntaxError:
                pass
    return found


# -- llm_args.py ------------------------------------------------------------------------------------


def dispatch_tables(module: Module, classes: set[str]) -> dict[str, list[str]]:
    """Class -> the strings that select it in ``{"Eagle": EagleDecodingConfig, ...}`` dict literals."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Dict) or not node.keys:
            continue
        pairs = [
            (key, value.id)
            for k, value in zip(node.keys, node.values)
            if (key := string_value(k)) is not None and isinstance(value, ast.Name) and value.id in classes
        ]
        if len(pairs) != len(node.keys):
            continue
        for key, name in pairs:
            names = found.setdefault(name, [])
            if key not in names:
                names.append(key)
    return found


def speculative_configs(module: Module) -> dict:
    """The decoding config classes: every one's ``decoding_type``, and the fields of those specdeploy uses."""
    decoding = sorted(
        (n for n in module.classes if n != DECODING_BASE and DECODING_BASE in lineage(module, n)[1:]),
        key=lambda n: module.classes[n].line,
    )
    if not decoding:  # no base class at this ref: fall back on the naming convention
        decoding = [n for n in module.classes if n.endswith("DecodingConfig")]
    tables = dispatch_tables(module, set(decoding))
    types: dict[str, dict] = {}
    for name in decoding:
        value, source = None, None
        for ancestor in lineage(module, name):
            info = module.classes[ancestor]
            if info.decoding_type is not None:
                value = info.decoding_type
                source = info.decoding_type_source if ancestor == name else f"inherited from {ancestor}"
                break
        if value is None and tables.get(name):
            value, source = tables[name][0], "dispatch table"
        types[name] = {"decoding_type": value, "source": source, "dispatch_names": tables.get(name, [])}

    roles: dict[str, str | None] = {}
    for role, (wanted_types, wanted_names) in ROLES.items():
        match = next((n for n in decoding if types[n]["decoding_type"] in wanted_types), None)
        match = match or next((n for n in decoding if any(t in types[n]["dispatch_names"] for t in wanted_types)), None)
        roles[role] = match or next((n for n in wanted_names if n in module.classes), None)
    # The class for EAGLE-3 at this ref: the "Eagle3" one, else the "Eagle" one (EAGLE-3 via eagle3_* fields).
    roles["eagle3_effective"] = roles["eagle3"] or roles["eagle"]

    classes = {}
    for name in dict.fromkeys(r for r in roles.values() if r is not None):
        info = module.classes[name]
        summary = class_summary(info, all_fields(module, name))
        summary.update(types.get(name, {"decoding_type": info.decoding_type, "source": info.decoding_type_source}))
        summary["roles"] = [role for role, found in roles.items() if found == name]
        classes[name] = summary
    base = module.classes.get(DECODING_BASE)
    return {
        "base": class_summary(base, all_fields(module, DECODING_BASE)) if base else None,
        "roles": roles,
        "classes": classes,
        "all_decoding_types": types,
    }


def kv_cache_config(tree: Tree, module: Module) -> dict | None:
    """``KvCacheConfig`` and its fields (followed through imports when defined elsewhere)."""
    info = locate_class(tree, module, "KvCacheConfig")
    if info is None:
        return None
    owner = module if info.path == module.path else parse_module(tree.read(info.path) or "", info.path)
    return class_summary(info, all_fields(owner, info.name))


def llm_args_class(module: Module) -> str | None:
    """The argument class of the PyTorch backend's ``LLM`` at this ref."""
    return next((n for n in LLM_ARGS_CLASSES if n in module.classes), None)


def llm_args(module: Module) -> dict | None:
    """The top-level ``LLM()`` arguments specdeploy sets, on the PyTorch backend's argument class."""
    name = llm_args_class(module)
    if name is None:
        return None
    fields = {f["name"]: f for f in all_fields(module, name)}
    result: dict[str, Any] = {
        "class": name,
        "lineage": lineage(module, name),
        "classes_present": {n: n in module.classes for n in ("BaseLlmArgs", "TorchLlmArgs", "TrtLlmArgs", "LlmArgs")},
        "fields": {n: fields.get(n) for n in LLM_ARG_FIELDS if n in fields},
        "missing": [n for n in LLM_ARG_FIELDS if n not in fields],
    }
    speculative = fields.get("speculative_config")
    if speculative and speculative["annotation"]:
        expanded = expand_aliases(ast.parse(speculative["annotation"], mode="eval").body, module.assignments)
        result["speculative_config_classes"] = [n for n in names_in(expanded) if n in module.classes]
    return result


def lora_config(tree: Tree, module: Module) -> dict | None:
    """The class the ``lora_config`` argument takes, found through the imports, and its fields."""
    name = llm_args_class(module)
    candidates: list[str] = []
    if name is not None:
        record = next((f for f in all_fields(module, name) if f["name"] == "lora_config"), None)
        if record and record["annotation"]:
            candidates = [n for n in names_in(ast.parse(record["annotation"], mode="eval").body) if "Lora" in n]
    for candidate in [*candidates, "LoraConfig"]:
        info = locate_class(tree, module, candidate)
        if info is not None:
            owner = module if info.path == module.path else parse_module(tree.read(info.path) or "", info.path)
            summary = class_summary(info, all_fields(owner, info.name))
            summary["imported_as"] = candidate
            return summary
    return None


# -- Triton's llmapi model ---------------------------------------------------------------------------


def commented_keys(source: str) -> list[dict]:
    """Keys a YAML file shows commented out (``# max_batch_size: 8``), with their lines."""
    found = []
    for number, line in enumerate(source.splitlines(), 1):
        match = re.match(r"^(\s*)#\s*([A-Za-z_][\w]*)\s*:(\s|$)", line)
        if match:
            found.append({"key": match.group(2), "indent": len(match.group(1)), "line": number})
    return found


def yaml_keys(data: Any) -> dict:
    """Top-level keys with scalar values kept, nested mappings as their own key lists."""
    if not isinstance(data, dict):
        return {}
    keys: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            keys[str(key)] = {"keys": yaml_keys(value)}
        elif isinstance(value, list):
            keys[str(key)] = {"list": len(value)}
        else:
            keys[str(key)] = value
    return keys


def model_py_calls(source: str) -> dict:
    """What ``model.py`` passes to ``generate_async`` and whether a ``lora_request`` is among it."""
    tree = ast.parse(source)
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (text(node.func) or "").split(".")[-1] == "generate_async":
            calls.append(
                {"line": node.lineno, "positional": len(node.args), "keywords": [k.arg for k in node.keywords]}
            )
    lora_lines = [
        {"line": number, "text": short(line.strip(), MAX_LINE_TEXT)}
        for number, line in enumerate(source.splitlines(), 1)
        if re.search(r"lora", line, re.I)
    ]
    return {
        "generate_async_calls": calls,
        "passes_lora_request": any("lora_request" in c["keywords"] for c in calls),
        "lora_lines": lora_lines,
        "builds_llm_from_yaml": "update_llm_args_with_extra_dict" in source,
    }


def llmapi_model(tree: Tree) -> dict:
    """The ``llmapi`` Triton model at this ref: ``model.yaml`` keys and ``model.py``'s use of LoRA."""
    source = tree.read(LLMAPI_MODEL_YAML)
    result: dict[str, Any] = {"present": source is not None, "path": LLMAPI_MODEL_YAML}
    if source is not None:
        try:
            result["keys"] = yaml_keys(yaml.safe_load(source))
        except yaml.YAMLError as error:
            result["yaml_error"] = short(str(error))
        result["commented_keys"] = commented_keys(source)
    code = tree.read(LLMAPI_MODEL_PY)
    result["model_py_present"] = code is not None
    if code is not None:
        result.update(model_py_calls(code))
    return result


# -- the feature-combination matrix ------------------------------------------------------------------


def clean_cell(cell: str) -> str:
    """A markdown table cell without emphasis, code marks or links."""
    cell = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell)
    return re.sub(r"[*`]+", "", cell).strip()


def markdown_tables(source: str) -> list[dict]:
    """Every pipe table: its first line, header cells and rows (lists of cells)."""
    tables: list[dict] = []
    lines = source.splitlines()
    index = 0
    while index < len(lines):
        header, separator = lines[index], lines[index + 1] if index + 1 < len(lines) else ""
        if header.strip().startswith("|") and re.match(r"^\s*\|?\s*:?-{2,}", separator):
            cells = [clean_cell(c) for c in header.strip().strip("|").split("|")]
            rows, index = [], index + 2
            while index < len(lines) and lines[index].strip().startswith("|"):
                rows.append([clean_cell(c) for c in lines[index].strip().strip("|").split("|")])
                index += 1
            tables.append({"line": index - len(rows) - 1, "header": cells, "rows": rows})
        else:
            index += 1
    return tables


def topics_of(label: str) -> list[str]:
    """The topics (``lora``, ``speculative``, ``pipeline_parallel``) a matrix heading concerns."""
    return [topic for topic, pattern in TOPICS.items() if pattern.search(label)]


def feature_matrix(tree: Tree) -> dict:
    """The matrix cells that pair LoRA or pipeline parallelism with speculative decoding."""
    source = tree.read(FEATURE_MATRIX)
    result: dict[str, Any] = {"present": source is not None, "path": FEATURE_MATRIX}
    if source is None:
        return result
    tables = [t for t in markdown_tables(source) if len(t["header"]) > 2]
    result.update({"tables": len(tables), "columns": [], "rows_of_interest": {}, "pairs": []})
    for table in tables:
        columns = table["header"][1:]
        result["columns"] += [c for c in columns if c not in result["columns"]]
        for row in table["rows"]:
            label, cells = row[0], dict(zip(columns, row[1:]))
            if topics_of(label):
                result["rows_of_interest"][label] = cells
            for column, value in cells.items():
                if not value or set(value) <= set("-—–"):
                    continue
                one, two = topics_of(label), topics_of(column)
                for first, second in PAIRS:
                    if (first in one and second in two) or (second in one and first in two):
                        pair = {"pair": f"{first} x {second}", "row": label, "column": column, "value": value}
                        result["pairs"].append(pair)
    return result


# -- the EAGLE-3 drafter's config reads --------------------------------------------------------------


def config_source(obj: str) -> str | None:
    """Which config an expression is: the drafter's ``config.json``, the speculative config, or None."""
    if re.search(r"spec_config|speculative_config|spec_dec", obj):
        return "speculative_config"
    if re.search(r"eagle_config", obj):
        return "eagle_config"
    if re.search(r"(^|\.)(\w*_)?config$", obj):
        return "model_config"
    return None


class ConfigReads(ast.NodeVisitor):
    """Collects ``getattr(config, "k")``, ``config.get("k")``, ``"k" in config``, ``config["k"]`` and
    ``config.k`` reads, each with its line and enclosing class/function, and registered architectures."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.reads: dict[tuple[str, str], dict] = {}
        self.architectures: list[dict] = []
        self.architecture_strings: dict[str, list[int]] = {}
        self.called: set[int] = set()
        self.calls: dict[str, set[str]] = {}  # scope -> the bare function names it calls

    def add(self, key: str, obj: str, kind: str, line: int) -> None:
        source = config_source(obj)
        if source is None:
            return
        entry = self.reads.setdefault(
            (key, source), {"key": key, "source": source, "kinds": [], "lines": [], "scopes": []}
        )
        scope = ".".join(self.scope) or "<module>"
        for name, value in (("kinds", kind), ("lines", line), ("scopes", scope)):
            if value not in entry[name]:
                entry[name].append(value)

    def visit_scoped(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if isinstance(node, ast.ClassDef):
            for decorator in node.decorator_list:
                registry = (text(decorator.func) or "").split(".")[-1] if isinstance(decorator, ast.Call) else ""
                if isinstance(decorator, ast.Call) and registry in REGISTRIES:
                    for argument in decorator.args:
                        value = string_value(argument)
                        if value is not None:
                            self.architectures.append(
                                {"name": value, "class": node.name, "registry": registry, "line": decorator.lineno}
                            )
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = visit_scoped

    def visit_Call(self, node: ast.Call) -> None:
        self.called.add(id(node.func))
        function = text(node.func) or ""
        if isinstance(node.func, ast.Name):
            self.calls.setdefault(".".join(self.scope), set()).add(node.func.id)
        if function in ("getattr", "hasattr") and len(node.args) >= 2:
            key = string_value(node.args[1])
            if key is not None:
                self.add(key, text(node.args[0]) or "", function, node.lineno)
        elif isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop") and node.args:
            key = string_value(node.args[0])
            if key is not None:
                self.add(key, text(node.func.value) or "", node.func.attr, node.lineno)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        key = string_value(node.left)
        if key is not None and node.ops and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            self.add(key, text(node.comparators[0]) or "", "in", node.lineno)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        key = string_value(node.slice)
        if key is not None and isinstance(node.ctx, ast.Load):
            self.add(key, text(node.value) or "", "subscript", node.lineno)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Load) and id(node) not in self.called:
            self.add(node.attr, text(node.value) or "", "attribute", node.lineno)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and re.fullmatch(r"\w+For(CausalLM|ConditionalGeneration)\w*", node.value):
            self.architecture_strings.setdefault(node.value, []).append(node.lineno)


def eagle_scopes(visitor: ConfigReads, tree: ast.Module) -> set[str]:
    """The scopes of the EAGLE classes (``eagle`` in their name) and the module-level functions they call."""
    scopes = {s for s in visitor.calls if "eagle" in s.lower()}
    functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    called = set().union(*(visitor.calls[s] for s in scopes)) if scopes else set()
    return scopes | (called & functions)


def eagle3_drafter(tree: Tree) -> dict:
    """The drafter config keys ``modeling_speculative.py`` reads, and the architectures it registers."""
    source = tree.read(MODELING_SPECULATIVE)
    result: dict[str, Any] = {"present": source is not None, "path": MODELING_SPECULATIVE}
    if source is None:
        return result
    visitor = ConfigReads()
    module = ast.parse(source)
    visitor.visit(module)
    reads = sorted(visitor.reads.values(), key=lambda r: (r["source"], r["lines"][0]))
    scopes = eagle_scopes(visitor, module)
    in_eagle = [r for r in reads if any("eagle" in s.lower() or s.split(".")[0] in scopes for s in r["scopes"])]
    result.update(
        {
            "architectures": visitor.architectures,
            "architecture_strings": visitor.architecture_strings,
            "eagle_config_keys": sorted({r["key"] for r in reads if r["source"] == "eagle_config"}),
            "drafter_config_keys_in_eagle_classes": sorted(
                {r["key"] for r in in_eagle if r["source"] in ("model_config", "eagle_config")}
            ),
            "speculative_config_keys_in_eagle_classes": sorted(
                {r["key"] for r in in_eagle if r["source"] == "speculative_config"}
            ),
            "reads": reads,
        }
    )
    return result


# -- one ref, and the differences between refs ------------------------------------------------------


def extract(tree: Tree, ref: str, note: str | None = None) -> dict:
    """Everything the planner needs from one ref (see the module docstring)."""
    files: dict[str, str | None] = {}

    class Recording:
        """The tree, noting the blob sha of every file read."""

        commit = tree.commit

        def read(self, path: str) -> str | None:
            files[path] = tree.blob_sha(path)
            return tree.read(path)

        def blob_sha(self, path: str) -> str | None:
            return tree.blob_sha(path)

    recording = Recording()
    result: dict[str, Any] = {"ref": ref, "commit": tree.commit}
    if note:
        result["selected"] = note
    source = recording.read(LLM_ARGS)
    if source is None:
        result.update({"speculative_configs": None, "kv_cache_config": None, "lora_config": None, "llm_args": None})
    else:
        module = parse_module(source, LLM_ARGS)
        result["speculative_configs"] = speculative_configs(module)
        result["kv_cache_config"] = kv_cache_config(recording, module)
        result["lora_config"] = lora_config(recording, module)
        result["llm_args"] = llm_args(module)
    result["llmapi_model_yaml"] = llmapi_model(recording)
    result["feature_matrix"] = feature_matrix(recording)
    result["eagle3_drafter"] = eagle3_drafter(recording)
    result["files"] = dict(sorted(files.items()))
    return result


def field_map(summary: dict | None) -> dict[str, dict]:
    """Field name -> record, for a class summary (empty for None)."""
    return {f["name"]: f for f in (summary or {}).get("fields", [])}


def field_brief(record: dict) -> str:
    """A field in a few words: annotation and default."""
    if record.get("required"):
        default = "required"
    elif "default_factory" in record:
        default = f"default_factory={record['default_factory']}"
    else:
        default = f"default={json.dumps(record['default']) if 'default' in record else record.get('default_expr')}"
    return f"{record['name']}: {record.get('annotation')} ({default})"


def compare_fields(label: str, old: dict | None, new: dict | None) -> list[str]:
    """Field additions, removals and annotation/default/alias changes between two class summaries."""
    before, after = field_map(old), field_map(new)
    out = [f"{label}: field added: {field_brief(after[n])}" for n in after if n not in before]
    out += [f"{label}: field removed: {n}" for n in before if n not in after]
    for name in (n for n in after if n in before):
        for key in ("annotation", "default", "default_expr", "default_factory", "required", "aliases", "status"):
            if before[name].get(key) != after[name].get(key):
                out.append(
                    f"{label}.{name}: {key} {json.dumps(before[name].get(key))} -> {json.dumps(after[name].get(key))}"
                )
    return out


def own_fields(spec: dict, name: str) -> dict:
    """A decoding config class's summary without the fields it inherits from ``DecodingBaseConfig``."""
    summary = spec["classes"][name]
    return {**summary, "fields": [f for f in summary["fields"] if f["defined_in"] != DECODING_BASE]}


def differences(old: dict, new: dict) -> list[str]:
    """What changed from ref ``old`` to ref ``new`` in the items this script extracts."""
    out: list[str] = []
    tag = f"{old['ref']} -> {new['ref']}"
    old_spec, new_spec = old.get("speculative_configs") or {}, new.get("speculative_configs") or {}
    old_types, new_types = old_spec.get("all_decoding_types", {}), new_spec.get("all_decoding_types", {})
    for name in new_types:
        if name not in old_types:
            out.append(f"speculative_configs: class added: {name} (decoding_type {new_types[name]['decoding_type']})")
        elif old_types[name]["decoding_type"] != new_types[name]["decoding_type"]:
            was, now = old_types[name]["decoding_type"], new_types[name]["decoding_type"]
            out.append(f"speculative_configs: {name} decoding_type {was} -> {now}")
    out += [f"speculative_configs: class removed: {n}" for n in old_types if n not in new_types]
    for role, name in new_spec.get("roles", {}).items():
        if old_spec.get("roles", {}).get(role) != name:
            out.append(f"speculative_configs: role {role}: {old_spec.get('roles', {}).get(role)} -> {name}")
    out += compare_fields(f"speculative_configs.{DECODING_BASE}", old_spec.get("base"), new_spec.get("base"))
    for role in ROLES:
        old_name, new_name = old_spec.get("roles", {}).get(role), new_spec.get("roles", {}).get(role)
        if old_name and new_name:
            label = f"speculative_configs.{new_name}" + (f" (was {old_name})" if old_name != new_name else "")
            out += compare_fields(label, own_fields(old_spec, old_name), own_fields(new_spec, new_name))
    out += compare_fields("kv_cache_config", old.get("kv_cache_config"), new.get("kv_cache_config"))
    old_lora, new_lora = old.get("lora_config") or {}, new.get("lora_config") or {}
    if (old_lora.get("class"), old_lora.get("file")) != (new_lora.get("class"), new_lora.get("file")):
        out.append(
            f"lora_config: class {old_lora.get('class')} in {old_lora.get('file')} -> "
            f"{new_lora.get('class')} in {new_lora.get('file')}"
        )
    out += compare_fields("lora_config", old_lora, new_lora)
    old_args, new_args = old.get("llm_args") or {}, new.get("llm_args") or {}
    if old_args.get("class") != new_args.get("class"):
        out.append(f"llm_args: class {old_args.get('class')} -> {new_args.get('class')}")
    for name, present in (new_args.get("classes_present") or {}).items():
        if (old_args.get("classes_present") or {}).get(name) != present:
            out.append(f"llm_args: class {name} {'added' if present else 'removed'}")
    out += compare_fields(
        "llm_args",
        {"fields": list((old_args.get("fields") or {}).values())},
        {"fields": list((new_args.get("fields") or {}).values())},
    )
    was, now = old_args.get("speculative_config_classes"), new_args.get("speculative_config_classes")
    if was != now:
        added = sorted(set(now or []) - set(was or []))
        removed = sorted(set(was or []) - set(now or []))
        out.append(f"llm_args.speculative_config accepts: added {added}, removed {removed}")
    old_model, new_model = old.get("llmapi_model_yaml") or {}, new.get("llmapi_model_yaml") or {}
    for key in ("present", "model_py_present", "passes_lora_request", "builds_llm_from_yaml"):
        if old_model.get(key) != new_model.get(key):
            out.append(f"llmapi_model_yaml.{key}: {old_model.get(key)} -> {new_model.get(key)}")
    old_keys, new_keys = set(old_model.get("keys") or {}), set(new_model.get("keys") or {})
    if old_keys != new_keys:
        out.append(
            f"llmapi_model_yaml keys: added {sorted(new_keys - old_keys)}, removed {sorted(old_keys - new_keys)}"
        )
    old_matrix, new_matrix = old.get("feature_matrix") or {}, new.get("feature_matrix") or {}
    if old_matrix.get("present") != new_matrix.get("present"):
        out.append(f"feature_matrix.present: {old_matrix.get('present')} -> {new_matrix.get('present')}")
    old_pairs = {(p["row"], p["column"]): p["value"] for p in old_matrix.get("pairs", [])}
    new_pairs = {(p["row"], p["column"]): p["value"] for p in new_matrix.get("pairs", [])}
    for cell in sorted(set(old_pairs) | set(new_pairs)):
        if old_pairs.get(cell) != new_pairs.get(cell):
            out.append(f"feature_matrix[{cell[0]} x {cell[1]}]: {old_pairs.get(cell)} -> {new_pairs.get(cell)}")
    old_draft, new_draft = old.get("eagle3_drafter") or {}, new.get("eagle3_drafter") or {}
    if old_draft.get("present") != new_draft.get("present"):
        out.append(f"eagle3_drafter.present: {old_draft.get('present')} -> {new_draft.get('present')}")
    old_arch = {a["name"] for a in old_draft.get("architectures", [])}
    new_arch = {a["name"] for a in new_draft.get("architectures", [])}
    if old_arch != new_arch:
        out.append(
            f"eagle3_drafter architectures: added {sorted(new_arch - old_arch)}, removed {sorted(old_arch - new_arch)}"
        )
    for key in (
        "eagle_config_keys",
        "drafter_config_keys_in_eagle_classes",
        "speculative_config_keys_in_eagle_classes",
    ):
        was_keys, now_keys = set(old_draft.get(key, [])), set(new_draft.get(key, []))
        if was_keys != now_keys:
            out.append(
                f"eagle3_drafter.{key}: added {sorted(now_keys - was_keys)}, removed {sorted(was_keys - now_keys)}"
            )
    return [f"{tag}: {line}" for line in out]


def run(source: Path, refs: list[str], commit: str | None, repository: str) -> dict:
    """Extract every ref from ``source`` (a git repository, or a plain directory with ``commit``)."""
    results = []
    if is_git_repository(source) and commit is None:
        for ref in refs:
            tag, sha, note = resolve_ref(source, ref)
            results.append(extract(GitTree(source, sha), tag, note))
    else:
        if len(refs) != 1 or commit is None:
            raise SystemExit("a directory without git takes exactly one --ref label and --commit")
        results.append(extract(DirTree(source, commit), refs[0]))
    diffs = [line for later in results[1:] for line in differences(results[0], later)]
    return {
        "generator": "scripts/extract_llm_api_rules.py",
        "repository": repository,
        "refs": results,
        "differences": diffs,
    }


def main(argv: list[str] | None = None) -> int:
    """The command line: extract the refs named (v1.2.1 and the newest tag by default) and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a TensorRT-LLM git mirror or checkout (or a plain directory)")
    parser.add_argument(
        "--ref",
        action="append",
        dest="refs",
        help="a tag or other ref (repeatable; 'newest': the newest release/rc tag); default: v1.2.1 and newest",
    )
    parser.add_argument("--commit", help="the commit a plain directory holds (no git)")
    parser.add_argument("--repository", default=REPOSITORY, help="recorded as the source repository")
    parser.add_argument("-o", "--output", type=Path, help="write the JSON here (default: stdout)")
    args = parser.parse_args(argv)
    rules = run(args.source, args.refs or ["v1.2.1", "newest"], args.commit, args.repository)
    out = json.dumps(rules, indent=1, ensure_ascii=False) + "\n"
    if args.output:
        args.output.write_text(out, encoding="utf-8")
    else:
        sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
