"""Draw docs/img/layers.png: the floors of ``pipeline/``, top to bottom, each part a box as wide as
its module count, with the number of imports each floor makes into the floors below.

    python scripts/layers_figure.py [--out docs/img/layers.png]

The floors are ``FLOORS`` of pipeline/docs_gen/layers.py (the table ``tests/test_import_graph.py``
holds every import to); rerun this when they change.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

from pipeline.docs_gen.layers import FLOORS, import_graph, part_of  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "layers.png"
ROW_H, GAP, UNIT, MIN_W, LABEL_W = 0.8, 0.25, 0.22, 2.2, 4.6
COLOURS = ("#e8eef7", "#e6f4ea", "#fdf1e0", "#ede7f6")


def draw(out: Path) -> None:
    graph = import_graph()
    counts: dict[str, int] = {}
    down = [0] * len(FLOORS)  # imports from each floor into a lower one
    for module, targets in graph.items():
        here = part_of(module)
        if here is None:
            continue
        counts[here[1]] = counts.get(here[1], 0) + 1
        down[here[0]] += sum(1 for t in targets if (part_of(t) or here)[0] < here[0])
    widths = [sum(max(MIN_W, UNIT * counts.get(p, 0)) for p in parts) + GAP * len(parts) for _, parts in FLOORS]
    width = max(widths) + LABEL_W
    fig, ax = plt.subplots(figsize=(width * 0.62, len(FLOORS) * (ROW_H + GAP) * 0.62 + 0.6))
    for row, (name, parts) in enumerate(reversed(FLOORS)):
        index = len(FLOORS) - 1 - row
        y = row * (ROW_H + GAP)
        ax.text(0, y + ROW_H / 2, name, ha="left", va="center", fontsize=9, color="#333333")
        x = LABEL_W
        for part in parts:
            w = max(MIN_W, UNIT * counts.get(part, 0))
            box = FancyBboxPatch(
                (x, y),
                w,
                ROW_H,
                boxstyle="round,pad=0.02,rounding_size=0.08",
                facecolor=COLOURS[index % len(COLOURS)],
                edgecolor="#555555",
                linewidth=0.8,
            )
            ax.add_patch(box)
            ax.text(x + w / 2, y + ROW_H / 2, f"{part}\n{counts.get(part, 0)}", ha="center", va="center", fontsize=7.5)
            x += w + GAP
        if down[index]:
            ax.text(x + 0.1, y + ROW_H / 2, f"↓ {down[index]}", ha="left", va="center", fontsize=8, color="#777777")
    ax.set_xlim(-0.1, width + 1.0)
    ax.set_ylim(-0.2, len(FLOORS) * (ROW_H + GAP))
    ax.invert_yaxis()
    ax.axis("off")
    ax.set_title(
        "pipeline/ by floor: each imports only its own floor and those below (box: part, modules)", fontsize=10
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    draw(parser.parse_args().out)


if __name__ == "__main__":
    main()
