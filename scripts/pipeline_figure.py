"""Draw docs/img/pipeline.png: the stages from a spec to a Triton server, as the README shows them.

    python scripts/pipeline_figure.py [--out docs/img/pipeline.png]

Drawn with matplotlib only (no project imports); rerun it when the stages change.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "pipeline.png"

# (title, what it makes, optional stage?, colour); two rows of six, read left to right. Every stage
# of pipeline/stages/execute.py's STAGE_BODIES is a box (tests/docs/test_pages_match_code.py).
ROWS = (
    (
        ("spec.yaml", "a base model and\nits variants", False, "#e8eef7"),
        ("validate + plan", "TensorRT-LLM 1.2.1 rules,\nmemory, resources", False, "#e8eef7"),
        ("merge", "LoRA adapters merged\n(PEFT arithmetic)", True, "#fdf1e0"),
        ("train-heads", "Medusa / EAGLE heads\nfor this variant", True, "#fdf1e0"),
        ("quantize", "FP8 checkpoint\n(ModelOpt)", True, "#fdf1e0"),
        ("convert", "TRT-LLM checkpoint,\nTP/PP shards + heads", False, "#e6f4ea"),
    ),
    (
        ("checkpoint", "target pytorch: the HF\ncheckpoint, no engine", True, "#fdf1e0"),
        ("evaluate", "every method measured\non CPU, one chosen", True, "#fdf1e0"),
        ("build", "engines with in-flight\nbatching (trtllm-build)", False, "#e6f4ea"),
        ("lora", "a shared engine's\nadapters, per task id", True, "#fdf1e0"),
        ("package", "Triton repository, or\ntrtllm-serve's options", False, "#e6f4ea"),
        ("serve", "tritonserver or\ntrtllm-serve", False, "#ede7f6"),
    ),
)
BOX_W, BOX_H, GAP_X, GAP_Y = 2.3, 1.15, 0.55, 0.9


def draw(out: Path) -> None:
    columns = len(ROWS[0])
    width = columns * BOX_W + (columns - 1) * GAP_X
    height = len(ROWS) * BOX_H + (len(ROWS) - 1) * GAP_Y
    fig, ax = plt.subplots(figsize=(width + 0.6, height + 0.9), dpi=150)
    ax.set_xlim(-0.3, width + 0.3)
    ax.set_ylim(-0.75, height + 0.15)
    ax.set_axis_off()
    centres = []
    for r, row in enumerate(ROWS):
        y = height - r * (BOX_H + GAP_Y) - BOX_H
        for c, (title, text, optional, colour) in enumerate(row):
            x = c * (BOX_W + GAP_X)
            ax.add_patch(
                FancyBboxPatch(
                    (x, y),
                    BOX_W,
                    BOX_H,
                    boxstyle="round,pad=0.02,rounding_size=0.12",
                    facecolor=colour,
                    edgecolor="#555555",
                    linewidth=1.2,
                    linestyle=(0, (4, 2)) if optional else "-",
                )
            )
            ax.text(x + BOX_W / 2, y + BOX_H * 0.72, title, ha="center", va="center", fontsize=11, weight="bold")
            ax.text(x + BOX_W / 2, y + BOX_H * 0.33, text, ha="center", va="center", fontsize=8.3, color="#333333")
            centres.append((x, y))
    arrow = dict(arrowstyle="-|>", mutation_scale=14, color="#444444", linewidth=1.3)
    for (x0, y0), (x1, y1) in zip(centres, centres[1:]):
        if y0 == y1:
            start, end = (x0 + BOX_W + 0.04, y0 + BOX_H / 2), (x1 - 0.04, y1 + BOX_H / 2)
            ax.add_patch(FancyArrowPatch(start, end, **arrow))
        else:  # end of a row to the start of the next: down to mid-gap, back left, down
            middle = y0 - GAP_Y / 2
            ax.plot([x0 + BOX_W / 2] * 2, [y0 - 0.02, middle], color="#444444", linewidth=1.3)
            ax.plot([x0 + BOX_W / 2, x1 + BOX_W / 2], [middle] * 2, color="#444444", linewidth=1.3)
            ax.add_patch(FancyArrowPatch((x1 + BOX_W / 2, middle), (x1 + BOX_W / 2, y1 + BOX_H + 0.04), **arrow))
    ax.text(
        width / 2,
        -0.45,
        "dashed: stages a variant runs only when its spec asks (adapters, heads.<method>.train, FP8, evaluation:,"
        " serving.lora: shared, target pytorch); each stage's output is atomic and fingerprinted under"
        " engines/<variant>/",
        ha="center",
        va="center",
        fontsize=8.3,
        color="#555555",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight", facecolor="white", metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    draw(parser.parse_args().out)


if __name__ == "__main__":
    main()
