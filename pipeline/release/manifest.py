"""The release manifest: what every variant was built from, with what, and what came out.

``engines/<spec name>/manifest.json``, written by every ``specdeploy engine`` run (local or on
Ray): per variant the sha256 of every input file (model, heads, calibration data, tokenizer and
Triton model sources: every stage input that no stage produced), of every output file, the plan,
the method and why it was chosen, how each stage ended and, when the evaluate stage ran, its choice,
release gates and per-candidate figures; once, the tool versions. Hashes are
streamed and cached by file identity (:mod:`pipeline.io.hashing`), so re-runs do not re-read a
checkpoint. ``specdeploy verify MANIFEST`` re-hashes the outputs (:func:`verify`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import pipeline
from pipeline.errors import UNWRITABLE, InputError, host_error
from pipeline.io.atomic import exclusive_lock
from pipeline.io.hashing import HashCache, content_files
from pipeline.plan.types import Plan, VariantPlan

MANIFEST_NAME = "manifest.json"
DONE_STATES = ("ran", "skipped", "gate failed")  # a stage whose output is complete ("gate failed": evaluate)
FORMAT = 2  # 2: paths relative to named roots; 1: absolute or cwd-relative paths
# Distribution names of the tools a release depends on (the first installed name wins).
TOOLS = {
    "tensorrt_llm": ("tensorrt_llm", "tensorrt-llm"),
    "nvidia-modelopt": ("nvidia-modelopt",),
    "torch": ("torch",),
    "transformers": ("transformers",),
    "safetensors": ("safetensors",),
    "nvidia-pytriton": ("nvidia-pytriton",),
    "tritonclient": ("tritonclient",),
    "ray": ("ray",),
}


def manifest_path(plan: Plan, engines_root: Path) -> Path:
    return Path(engines_root) / plan.spec_name / MANIFEST_NAME


def git_revision(folder: Path) -> str | None:
    """The checkout's commit (``+dirty`` with uncommitted changes), None outside a git checkout."""
    if shutil.which("git") is None or not (folder / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def tool_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {
        "specdeploy": pipeline.__version__,
        "specdeploy_git": git_revision(Path(pipeline.__file__).resolve().parents[1]),
    }
    for tool, names in TOOLS.items():
        versions[tool] = None
        for name in names:
            try:
                versions[tool] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    versions["tritonserver"] = os.environ.get("TRITON_SERVER_VERSION")  # set in NVIDIA's Triton containers
    return versions


def _files(path: Path, hashes: HashCache) -> dict[str, str]:
    """{file path relative to ``path``: sha256} of every content file of a folder ({its name: sha256}
    for a file)."""
    path = Path(path)
    if path.is_file():
        return {path.name: hashes.sha256(path)}
    if path.is_dir():
        return {file.relative_to(path).as_posix(): hashes.sha256(file) for file in content_files(path)}
    return {}


def _located(path: Path, roots: dict[str, Path]) -> dict[str, str | None]:
    """``path`` as {"root": the first of ``roots`` that holds it, "path": relative to it}; a path
    under none of them (an absolute model path the spec names) stays absolute, with root null."""
    resolved = Path(os.path.abspath(path))
    for name, root in roots.items():
        if resolved == root or root in resolved.parents:
            return {"root": name, "path": resolved.relative_to(root).as_posix() or "."}
    return {"root": None, "path": str(resolved)}


def _relocated(value: Any, roots: dict[str, Path]) -> Any:
    """``value`` (the plan as JSON) with every absolute path under one of ``roots`` written as
    {"root", "path"} (:func:`_located`), so the manifest names no place of the build host's.

    >>> _relocated({"out": "/b/engines/a", "n": ["/b/engines", "/etc/x", 3]}, {"engines": Path("/b/engines")})
    {'out': {'root': 'engines', 'path': 'a'}, 'n': [{'root': 'engines', 'path': '.'}, '/etc/x', 3]}"""
    if isinstance(value, dict):
        return {key: _relocated(item, roots) for key, item in value.items()}
    if isinstance(value, list):
        return [_relocated(item, roots) for item in value]
    if isinstance(value, str) and value.startswith("/"):
        located = _located(Path(value), roots)
        return located if located["root"] is not None else value
    return value


def manifest_roots(plan: Plan, engines_root: Path, cache: Path | None = None) -> dict[str, Path]:
    """The folders the manifest's paths are relative to, as they are on this host: the outputs'
    (engines, triton_repo: each variant's package stage writes there), the cache (the embedded
    model), the spec's folder (model paths are relative to it) and the installed specdeploy (the
    Triton model sources)."""
    roots = {
        "engines": Path(engines_root),
        "triton_repo": plan.variants[0].stage("package").output.parent if plan.variants else None,
        "cache": cache,
        "spec": Path(plan.spec_file).parent,
        "specdeploy": Path(pipeline.__file__).parent,
    }
    return {name: Path(os.path.abspath(root)) for name, root in roots.items() if root is not None}


def variant_entry(
    variant: VariantPlan, states: dict[str, str], hashes: HashCache, roots: dict[str, Path] | None = None
) -> dict[str, Any]:
    roots = roots or {}
    produced = {stage.output for stage in variant.stages}
    inputs: dict[str, dict[str, Any]] = {}
    for stage in variant.stages:
        for name, path in stage.inputs.items():
            if path not in produced and name not in inputs:
                inputs[name] = _located(path, roots) | {"files": _files(path, hashes)}
    outputs = {
        stage.name: _located(stage.output, roots)
        | {
            "state": states.get(stage.name, "not run"),
            "files": _files(stage.output, hashes) if states.get(stage.name) in DONE_STATES else {},
        }
        for stage in variant.stages
    }
    return {
        "method": variant.method,
        "method_reason": variant.speculative.reason,
        "target": variant.target,
        "inputs": inputs,
        "outputs": outputs,
        "plan": _relocated(variant.to_dict(), roots),
        "evaluation": _evaluation(variant, states),
    }


def _evaluation(variant: VariantPlan, states: dict[str, str]) -> dict[str, Any] | None:
    """The evaluate stage's choice, gates and figures, when that stage ran (or was up to date)."""
    from pipeline.evaluation.result import manifest_entry

    stage = next((s for s in variant.stages if s.name == "evaluate"), None)
    if stage is None or states.get("evaluate") not in DONE_STATES:
        return None
    return manifest_entry(stage.output)


def write_manifest(
    plan: Plan,
    engines_root: Path,
    states: dict[str, dict[str, str]],
    hashes: HashCache,
    repository: Path | None = None,
    cache: Path | None = None,
) -> Path:
    """Write (atomically) the manifest of the variants in ``states`` ({variant: {stage: state}});
    variants of an earlier run that this one did not touch are kept. ``repository``: the whole-spec
    Triton repository when this run wrote it (or found it up to date); ``cache``: the cache folder
    (embedded models are prepared there).

    Every path is relative to a named root (:func:`manifest_roots`): outputs to ``engines`` or
    ``triton_repo``, each listed file to its output or input folder, so the release can move."""
    path = manifest_path(plan, engines_root)
    roots = manifest_roots(plan, engines_root, cache)
    entries = {v.name: variant_entry(v, states[v.name], hashes, roots) for v in plan.variants if v.name in states}
    for v in plan.variants:  # how each LoRA fine-tune is served: shared (group, lora_task_id) or merged
        if v.name in entries:
            entries[v.name]["lora"] = plan.lora_of(v)
    locked = False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Two runs of one spec (say --variant a and --variant b) each keep the other's entries.
        with exclusive_lock(path.parent / f".{path.name}.lock", timeout=600, what=str(path), on_wait=lambda _: None):
            locked = True
            previous, body = _next_manifest(path, plan, entries, hashes, repository, roots)
            _write(path, body)
    except OSError as exc:
        # Not writable here (a read-only artifact): fine when the manifest already says all this.
        if not locked and exc.errno in UNWRITABLE:
            previous, body = _next_manifest(path, plan, entries, hashes, repository, roots)
            if _content(previous) == _content(body):
                return path
        raise host_error(exc, f"writing the release manifest {path}") from None
    return path


def _content(body: dict[str, Any]) -> dict[str, Any]:
    """The manifest as JSON reads it back, less when and where it was written (the roots' absolute
    places) and whether a complete stage ran then or was found up to date: what its outputs are is
    all that counts."""
    content = {key: value for key, value in json.loads(json.dumps(body)).items() if key not in ("written", "roots")}
    for variant in content.get("variants", {}).values():
        for output in variant.get("outputs", {}).values():
            if output.get("state") in ("ran", "skipped"):
                output["state"] = "complete"
    return content


def _next_manifest(
    path: Path,
    plan: Plan,
    entries: dict[str, Any],
    hashes: HashCache,
    repository: Path | None,
    roots: dict[str, Path],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the manifest on disk, {} when none or unreadable; the one this run writes)."""
    try:
        previous = _read(path) if path.exists() else {}
    except InputError:  # unreadable: this run writes it anew
        previous = {}
    variants = dict(previous.get("variants", {})) if previous.get("name") == plan.spec_name else {}
    spec_repository = (
        _located(repository, roots) | {"files": _files(repository, hashes)}
        if repository is not None
        else previous.get("repository")
    )
    return previous, _body(plan, variants | entries, hashes, spec_repository, roots)


def _write(path: Path, body: dict[str, Any]) -> None:
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(body, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def _body(
    plan: Plan,
    variants: dict[str, Any],
    hashes: HashCache,
    repository: dict[str, Any] | None,
    roots: dict[str, Path],
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        # Where the roots were on the host that wrote this, for the record; verify does not need them.
        "roots": {name: str(root) for name, root in roots.items()},
        "spec": _located(Path(plan.spec_file), roots),
        "name": plan.spec_name,
        "spec_sha256": hashes.sha256(plan.spec_file) if Path(plan.spec_file).is_file() else None,
        "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "tools": tool_versions(),
        "variants": variants,
        "repository": repository,  # triton_repo/<spec>/: every variant from one server
        # serving.lora auto: the planner's choice per fine-tune, its objective and numbers (pipeline/lora/auto.py)
        "lora_decisions": [decision.to_dict() for decision in plan.lora_decisions],
    }


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(
            f"{path}: no such manifest; `specdeploy engine SPEC` writes engines/<spec>/{MANIFEST_NAME}"
        ) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a readable manifest ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("variants"), dict):
        raise InputError(f"{path}: not a specdeploy manifest (no 'variants' object)")
    return data


def verify(path: Path, hashes: HashCache | None = None, triton_repo: Path | None = None) -> tuple[int, list[str]]:
    """Re-hash every output file the manifest lists: (files checked, problems); the problems
    name each changed or missing file. Reads the files (no cache) unless ``hashes`` is given.

    The engines root is the folder the manifest is in (``<engines>/<spec>/manifest.json``), the
    Triton repository root ``triton_repo`` (default: where the manifest's writer had it), so a
    release verifies wherever it was moved. Manifests of format 1 list absolute paths."""
    path = Path(path)
    data = _read(path)
    hashes = hashes or HashCache(None)
    recorded = data.get("roots") or {}
    roots = {
        "engines": path.parent.parent,
        "triton_repo": Path(triton_repo) if triton_repo is not None else Path(recorded.get("triton_repo", ".")),
    }
    checked, problems = 0, []
    listed = [
        (f"{name} {stage}", output)
        for name, variant in sorted(data["variants"].items())
        for stage, output in sorted((variant.get("outputs") or {}).items())
    ]
    if data.get("repository"):
        listed.append((f"{data.get('name')} repository", data["repository"]))
    for what, output in listed:
        folder = _folder(output, roots)
        for name, expected in sorted((output.get("files") or {}).items()):
            checked += 1
            file = folder / name if folder is not None else Path(name)
            if not file.is_file():
                problems.append(f"{file}: missing ({what})")
            elif hashes.sha256(file) != expected:
                problems.append(f"{file}: changed ({what}; sha256 differs from the manifest)")
    return checked, problems


def _folder(entry: dict[str, Any], roots: dict[str, Path]) -> Path | None:
    """The folder an output entry's files are relative to; None for format 1 (absolute file paths)."""
    if "root" not in entry:
        return None
    root = entry["root"]
    if root not in roots:
        return Path(entry["path"])
    return roots[root] / entry["path"]
