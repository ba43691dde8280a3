"""The train-heads stage: the variant's Medusa heads or EAGLE drafter trained against its own target.

The target is the merged checkpoint of a fine-tune (or the model itself); ``init: base`` starts from
the heads the variant inherits (see :mod:`pipeline.plan.head_training`, :mod:`pipeline.heads.refresh`).
The output is a heads folder the convert stage reads like shipped heads.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.plan.types import StagePlan, VariantPlan


def run(variant: VariantPlan, stage: StagePlan, out: Path) -> None:
    """Torch uses the threads the process has (``OMP_NUM_THREADS``); the seed makes a re-run reproduce."""
    from pipeline.heads.fixed_text import BUILTIN_TEXT
    from pipeline.heads.refresh import SELF_DISTILL, RefreshSettings, refresh_heads

    p = stage.params
    data = {"self-distill": SELF_DISTILL, "fixed-text": BUILTIN_TEXT}.get(p["data"]) or str(stage.inputs["data"])
    settings = RefreshSettings(
        method=p["method"],
        init=stage.inputs.get("init"),
        data=data,
        tokens=p["tokens"],
        epochs=p["epochs"],
        device=p["device"],
        seed=p["seed"],
        num_heads=p["num_heads"] or RefreshSettings.num_heads,
    )
    refresh_heads(
        stage.inputs["model"],
        out,
        settings,
        say=lambda text: print(f"[{variant.name}] {text}", flush=True),
        cache=stage.output.parent / ".heads-data",  # beside the output: another epochs setting only trains
    )
