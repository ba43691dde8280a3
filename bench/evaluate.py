"""How long the evaluate stage takes on a shipped SmolLM2 spec, and what the shared prefill saves.

    .venv/bin/python bench/evaluate.py [--spec specs/smollm2-eagle.yaml] [--count 32] [--new-tokens 64]

Copies the spec to bench/out/specs with an ``evaluation:`` section (count, max_new_tokens), runs
its stages up to evaluate through the pipeline (convert is reused when up to date; evaluate is
forced), and prints the wall time of the evaluate stage, the candidates, and the CPU time the
shared prefill saved (each prompt prefilled once instead of once per candidate). Writes the
evaluation under bench/out/engines/<spec>/evaluation/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.cli import main as cli

OUT = REPO / "bench" / "out"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(REPO / "specs" / "smollm2-eagle.yaml"))
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    source = Path(args.spec)
    text = source.read_text().replace("path: ../heads/", f"path: {REPO}/heads/")
    text += f"evaluation:\n  count: {args.count}\n  max_new_tokens: {args.new_tokens}\n"
    copy = OUT / "specs" / source.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(text)
    engines = OUT / "engines"
    started = time.perf_counter()
    code = cli(
        ["--engines-dir", str(engines), "--triton-repo", str(OUT / "triton_repo"), "evaluate", str(copy), "--force"]
    )
    if code:
        return code
    total = time.perf_counter() - started
    name = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("name:"))
    result = json.loads((engines / name / "evaluation" / "evaluation.json").read_text())
    timing = result["timing"]
    print(
        f"{name}: {len(result['candidates'])} candidates x {result['prompts']['count']} prompts x "
        f"{args.new_tokens} tokens: evaluate stage {timing['wall_s']:.0f} s wall ({total:.0f} s with loading "
        f"and convert check); decode {timing['decode_cpu_s']:.0f} CPU-s; shared prefill "
        f"{timing['prefill_cpu_s']:.1f} CPU-s, saved {timing['prefill_saved_cpu_s']:.1f} CPU-s "
        f"({len(result['candidates']) - 1} prefills per prompt avoided)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
