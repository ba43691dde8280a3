"""What the planner learns from PEFT LoRA adapter folders, without torch or weights.

``model.adapter`` names one folder or a list (applied in order). Here: adapter_config.json is
read and checked, the rule for its ``base_model_name_or_path`` is applied, and each variant's
merge gets its output folder; :mod:`pipeline.checkpoint.lora` checks tensors and merges.

Variants with the same base model and the same adapter list share one merged checkpoint: it is
written under the first such variant (``engines/<first>/merged``) and the others' merge stage
finds it up to date (same inputs, same fingerprint), so a base is merged once per adapter list.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline.errors import InputError
from pipeline.io.files import kind_of

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# PEFT options whose effect is not "add a low-rank update to a weight": refused when set.
_UNSUPPORTED_OPTIONS = (
    "layer_replication",
    "trainable_token_indices",
    "target_parameters",
    "alora_invocation_tokens",
    "use_qalora",
    "use_bdlora",
    "arrow_config",
)


@dataclass(frozen=True)
class AdapterConfig:
    """The fields of adapter_config.json the merge reads, validated."""

    file: Path
    r: int
    lora_alpha: float
    use_rslora: bool
    use_dora: bool
    rank_pattern: dict[str, int]
    alpha_pattern: dict[str, float]
    target_modules: tuple[str, ...] | str | None  # a list of names, or PEFT's full-match regex
    modules_to_save: tuple[str, ...]
    base_model_name_or_path: str | None

    def rank_and_alpha(self, module: str) -> tuple[int, float]:
        """PEFT's rule (``peft.utils.other.get_pattern_key``): the first pattern key that matches the
        end of the module name at a dot boundary wins."""

        def pick(patterns: dict[str, Any], default: Any) -> Any:
            for key, value in patterns.items():
                if re.match(rf"(.*\.)?({key})$", module):
                    return value
            return default

        return pick(self.rank_pattern, self.r), pick(self.alpha_pattern, self.lora_alpha)

    def scale(self, module: str) -> float:
        r, alpha = self.rank_and_alpha(module)
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except (TypeError, OverflowError):  # an integer too large for a float: no scale can use it
        return False


def _number(data: dict[str, Any], key: str, where: Path, *, integer: bool) -> Any:
    value = data.get(key)
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    # json reads NaN and Infinity as floats; NaN <= 0 is False, so finiteness is its own test.
    if isinstance(value, bool) or not ok or not _finite(value) or value <= 0:  # type: ignore[operator]
        kind = "a positive integer" if integer else "a positive finite number"
        raise InputError(f"{where}: {key} must be {kind}, got {value!r}; re-save the adapter with PEFT")
    return value


def read_adapter_config(folder: Path) -> AdapterConfig:
    where = folder / CONFIG_FILE
    try:
        data = json.loads(where.read_text())
    except FileNotFoundError:
        raise InputError(
            f"{where}: missing; model.adapter must name a PEFT LoRA folder "
            "(adapter_config.json + adapter_model.safetensors)"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{where}: not valid JSON ({exc}); re-save the adapter with PEFT") from None
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a JSON object; re-save the adapter with PEFT")
    if data.get("peft_type") != "LORA":
        raise InputError(
            f"{where}: peft_type {data.get('peft_type')!r} is not supported; only LoRA (peft_type LORA) "
            "adapters can be merged"
        )
    for option in _UNSUPPORTED_OPTIONS:
        if data.get(option) not in (None, False, {}, []):
            raise InputError(
                f"{where}: {option} is set; merging such adapters is not supported (a merged "
                "checkpoint can only hold weight updates)"
            )
    if data.get("fan_in_fan_out"):
        raise InputError(f"{where}: fan_in_fan_out is true (GPT-2 Conv1D layers); Llama linears are not transposed")
    if data.get("lora_bias") or data.get("bias", "none") != "none":
        raise InputError(
            f"{where}: bias training (bias={data.get('bias')!r}, lora_bias={data.get('lora_bias')!r}) "
            "is not supported: Llama layers have no biases to merge into; retrain with bias='none'"
        )
    patterns = {}
    for key, integer in (("rank_pattern", True), ("alpha_pattern", False)):
        raw = data.get(key) or {}
        if not isinstance(raw, dict):
            raise InputError(f"{where}: {key} must be a mapping of module patterns to numbers")
        patterns[key] = {str(k): _number(raw, k, where, integer=integer) for k in raw}
    targets = data.get("target_modules")
    if isinstance(targets, list):
        targets = tuple(str(t) for t in targets)
    elif targets is not None and not isinstance(targets, str):
        raise InputError(f"{where}: target_modules must be a list of names or a regex string")
    saved = data.get("modules_to_save") or ()
    if not isinstance(saved, (list, tuple)):
        raise InputError(f"{where}: modules_to_save must be a list of module names")
    base_name = data.get("base_model_name_or_path")
    return AdapterConfig(
        file=where,
        r=_number(data, "r", where, integer=True),
        lora_alpha=_number(data, "lora_alpha", where, integer=False),
        use_rslora=bool(data.get("use_rslora")),
        use_dora=bool(data.get("use_dora")),
        rank_pattern=patterns["rank_pattern"],
        alpha_pattern=patterns["alpha_pattern"],
        target_modules=targets,
        modules_to_save=tuple(str(m) for m in saved),
        base_model_name_or_path=str(base_name) if base_name else None,
    )


def base_name_problem(config: AdapterConfig, model_names: list[str], model_dir: Path | None) -> str | None:
    """The rule for ``base_model_name_or_path``: it names the spec's model when its last path component
    equals (case-insensitively) the model folder's name, the builtin name or config.json's
    ``_name_or_path``, or when it is that very folder on this host. Unset (PEFT writes null for a
    model built in memory) is accepted. A differing name is refused: an adapter trained on another
    checkpoint of the same shape would merge without error and be silently wrong."""
    named = config.base_model_name_or_path
    if not named:
        return None
    if model_dir is not None and Path(named).expanduser().is_dir():
        try:
            if Path(named).expanduser().resolve() == model_dir.resolve():
                return None
        except OSError:
            pass
    wanted = named.rstrip("/").rsplit("/", 1)[-1].lower()
    if wanted in {name.rstrip("/").rsplit("/", 1)[-1].lower() for name in model_names if name}:
        return None
    shown = ", ".join(repr(n) for n in model_names if n)
    return (
        f"{config.file}: base_model_name_or_path {named!r} is not the spec's model ({shown}); "
        "merge an adapter only into the model it was trained on (or fix base_model_name_or_path if the "
        "model was only renamed)"
    )


def adapter_folder_problem(folder: Path) -> str:
    """Why ``folder``, which is not a folder, cannot be an adapter: missing, or a file of some kind."""
    what = "not found" if not folder.exists() else f"is {kind_of(folder)}, not a folder"
    return (
        f"{folder}: adapter folder {what} (model.adapter names a PEFT LoRA folder: adapter_config.json + "
        "adapter_model.safetensors)"
    )


def check_adapter_folder(folder: Path, require_weights: bool = True) -> AdapterConfig:
    """The cheap plan-time check: the folder, its config and a weights file exist and parse.

    ``require_weights=False`` (a plan from a preset, without the base's weights): the config alone is
    read, as the planner needs only its rank and target modules; the merge and lora stages still refuse
    a folder without weights."""
    if not folder.is_dir():
        raise InputError(adapter_folder_problem(folder))
    config = read_adapter_config(folder)
    if require_weights and not has_weights(folder):
        raise InputError(
            f"{folder}: no adapter_model.safetensors or adapter_model.bin; model.adapter must name a PEFT LoRA folder"
        )
    return config


def has_weights(folder: Path) -> bool:
    return any((folder / name).is_file() for name in WEIGHT_FILES)


class _Problems(Protocol):
    def error(self, path: tuple, message: str) -> None: ...

    def note(self, message: str) -> None: ...


@dataclass(frozen=True)
class MergeTarget:
    """Where a variant's merged checkpoint goes and what it is made of."""

    output: Path
    adapters: tuple[Path, ...]
    owner: str  # the first variant with this base and adapter list; it owns the folder


def _model_key(spec: Any, variant: Any) -> tuple:
    model = variant.model
    source = ("builtin", model.builtin) if model.builtin else ("path", str(spec.resolve_path(model.path or "")))
    return source, tuple(str(spec.resolve_path(p)) for p in model.adapters)


def plan_merge(
    spec: Any, variant: Any, engines: Path, model_dir: Path | None, problems: _Problems, weights_present: bool = True
) -> MergeTarget | None:
    """The merge a variant needs (None without adapters); problems are reported at model.adapter.

    Without the base's weights (``weights_present`` False: planned from a preset) an adapter folder
    may hold its adapter_config.json alone: the plan says so in a note, and the merge stage needs the
    weights as it needs the base's."""
    model = variant.model
    if not model.adapters:
        return None
    folders = tuple(spec.resolve_path(p) for p in model.adapters)
    names = [model.builtin] if model.builtin else []
    if model_dir is not None:
        names.append(model_dir.name)
        try:
            names.append(json.loads((model_dir / "config.json").read_text()).get("_name_or_path") or "")
        except (OSError, ValueError, AttributeError):
            pass
    for index, folder in enumerate(folders):
        where = ("model", "adapter") if isinstance(model.adapter, str) else ("model", "adapter", index)
        try:
            config = check_adapter_folder(folder, require_weights=weights_present)
        except InputError as exc:
            problems.error(where, str(exc))
            continue
        if not has_weights(folder):
            problems.note(f"{folder}: adapter_config.json only (no adapter weights): planned from the config")
        problem = base_name_problem(config, names, model_dir)
        if problem:
            problems.error(where, problem)
    key = _model_key(spec, variant)
    owner = next(v.name for v in spec.variants if _model_key(spec, v) == key)
    return MergeTarget(engines / owner / "merged", folders, owner)
