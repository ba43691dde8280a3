"""Write the 24 adapter configs of the Llama-3.1-8B LoRA fleet (configs only: no weights).

    .venv/bin/python scripts/llama8b_fleet_adapters.py [--out adapters/llama8b-fleet]

Each fine-tune is a PEFT ``LoraConfig`` saved by PEFT itself (``save_pretrained`` writes
adapter_config.json), with the rank and target modules such a fine-tune would typically use: rank 8-16
on the attention projections for light style or format tasks, 32-64 on every projection for tasks
that teach new knowledge or a new language. The planner plans them from the preset without weights.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = "meta-llama/Llama-3.1-8B-Instruct"
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
QV = ("q_proj", "v_proj")
ALL = (*ATTENTION, "gate_proj", "up_proj", "down_proj")

# name: (rank, target modules)
FINE_TUNES: dict[str, tuple[int, tuple[str, ...]]] = {
    "support": (16, ATTENTION),
    "sql": (32, ALL),
    "legal-summary": (16, ATTENTION),
    "code-review": (32, ALL),
    "python-coder": (64, ALL),
    "json-extract": (8, QV),
    "email-reply": (8, QV),
    "medical-notes": (32, ALL),
    "finance-qa": (16, ATTENTION),
    "translate-de": (64, ALL),
    "translate-fr": (64, ALL),
    "translate-es": (64, ALL),
    "product-desc": (8, QV),
    "meeting-minutes": (16, ATTENTION),
    "contract-clauses": (32, ALL),
    "tech-docs": (16, ATTENTION),
    "chat-persona": (8, QV),
    "tool-calling": (16, ALL),
    "math-tutor": (32, ALL),
    "news-summary": (16, ATTENTION),
    "hr-policy": (8, ATTENTION),
    "ticket-triage": (8, QV),
    "regex-writer": (16, ALL),
    "shell-helper": (32, ALL),
}


def write(out: Path) -> list[Path]:
    from peft import LoraConfig

    written = []
    for name, (rank, modules) in FINE_TUNES.items():
        config = LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            target_modules=list(modules),
            lora_dropout=0.05,
            bias="none",
            task_type="CAUSAL_LM",
            base_model_name_or_path=BASE,
        )
        folder = out / name
        config.save_pretrained(str(folder))
        written.append(folder / "adapter_config.json")
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "adapters" / "llama8b-fleet")
    args = parser.parse_args()
    for path in write(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
