"""What the planner needs to know about ``heads.<method>.train``, without torch.

A variant whose heads have a ``train`` section gets a ``train-heads`` stage (after ``merge``, before
``quantize``/``convert``): its heads are trained against the variant's own target (the merged
checkpoint of a fine-tune, else the model) into ``engines/<variant>/heads/``, and the convert and
evaluate stages read that folder instead of ``path``. ``init: base`` warm-starts from ``path``, the
heads the variant inherits from the spec's base (:mod:`pipeline.heads.refresh` trains).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline import methods

SELF_DISTILL, FIXED_TEXT = "self-distill", "fixed-text"
# What the heads learn: the target's own top-10 next-token distribution, on every kind of data.
# Fingerprinted, so heads trained on other labels (the text's tokens, greedy tokens only) retrain.
LABELS = "target-top-10"
PROMPTS_DIR = Path(__file__).parents[1] / "data" / "prompts"  # the self-distillation prompts (train files)


class _Problems(Protocol):
    def error(self, path: tuple, message: str) -> None: ...


@dataclass(frozen=True)
class HeadsTraining:
    """The train-heads stage of one variant."""

    method: str  # medusa | eagle
    output: Path  # engines/<variant>/heads
    init: Path | None  # the heads to warm-start from (init: base)
    data: str  # self-distill | fixed-text | a resolved file path
    params: dict[str, Any]  # the fingerprinted settings

    @property
    def inputs(self) -> dict[str, Path]:
        """Fingerprinted inputs besides the target model: the init heads and the data."""
        found: dict[str, Path] = {}
        if self.init is not None:
            found["init"] = self.init
        if self.data == SELF_DISTILL:
            found["prompts"] = PROMPTS_DIR
        elif self.data != FIXED_TEXT:
            found["data"] = Path(self.data)
        return found


def plan_training(
    spec: Any, variant: Any, method: str, variant_root: Path, problems: _Problems
) -> HeadsTraining | None:
    """The training the chosen ``method`` needs (None when its heads are not trained)."""
    need = methods.definition(method).heads
    heads = getattr(variant.heads, need.key) if need is not None else None
    for other in (d.heads.key for d in methods.with_heads() if d.heads is not None):
        unused = getattr(variant.heads, other)
        if (need is None or other != need.key) and unused is not None and unused.train is not None:
            problems.error(
                ("heads", other, "train"),
                f"the variant decodes with {method}, so its {other} heads would be trained for nothing; "
                f"remove heads.{other}.train or set speculative.method: {other}",
            )
    if heads is None or heads.train is None:
        return None
    train = heads.train
    init = spec.resolve_path(heads.path) if train.init == "base" else None
    if init is not None and not (init / "config.json").is_file():
        problems.error(
            ("heads", method, "path"),
            f"{init}: no heads there to warm-start from (train.init: base); give the base's heads or use init: random",
        )
    elif init is not None and need is not None and need.warm_start_problem is not None:  # the trainer's refusal
        problem = need.warm_start_problem(init)
        if problem is not None:
            problems.error(("heads", method, "train", "init"), f"{init}: {problem}")
    data = train.data
    if data not in (SELF_DISTILL, FIXED_TEXT):
        resolved = spec.resolve_path(data)
        if not resolved.is_file():
            problems.error(
                ("heads", method, "train", "data"),
                f"{resolved}: not found; give self-distill, fixed-text or a text/JSONL file",
            )
        data = str(resolved)
    params = {
        "method": method,
        "init": train.init,
        "data": train.data if train.data in (SELF_DISTILL, FIXED_TEXT) else "file",
        "tokens": train.tokens,
        "epochs": train.epochs,
        "device": train.device,
        "seed": train.seed,
        "num_heads": getattr(heads, "num_heads", None),
        "labels": LABELS,
    }
    return HeadsTraining(method, variant_root / "heads", init, data, params)
