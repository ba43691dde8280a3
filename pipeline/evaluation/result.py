"""Where the evaluate stage's result lives, and what later steps read from it."""

from __future__ import annotations

import json
from pathlib import Path

RESULT_FILE = "evaluation.json"
RELEASE_EXIT_CODE = 6  # a release gate failed (release.on_fail: fail); 4 and 5 are filesystem errors
GATE_FAILED = "gate failed"  # the evaluate stage's state when it ran and its choice failed a release gate


def read_result(output: Path) -> dict | None:
    """The evaluation in an evaluate stage's output folder, or None when there is none."""
    try:
        return json.loads((output / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None


def release_failure(output: Path) -> str | None:
    """The failed gate an evaluation recorded (None: passed, or no evaluation there)."""
    result = read_result(output)
    return (result.get("choice") or {}).get("failed") if result else None


def manifest_entry(output: Path) -> dict | None:
    """What the release manifest records of an evaluation: the choice and why, the gates and how each
    candidate fared against them, and each candidate's figures (None when there is no evaluation)."""
    result = read_result(output)
    if result is None:
        return None
    choice = result.get("choice") or {}
    misses = choice.get("misses") or {}
    settings = result.get("settings") or {}
    batch = (settings.get("batch_sizes") or [1])[0]
    return {
        "file": str(output / RESULT_FILE),
        "method_requested": result.get("method_requested"),
        "chosen": choice.get("candidate"),
        "chosen_method": choice.get("method"),
        "reason": choice.get("reason"),
        "release_failed": choice.get("failed"),
        "speedup_bound": choice.get("speedup_bound"),
        "not_separable": choice.get("not_separable"),
        "gates": result.get("release"),
        "gpu": result.get("gpu"),
        "expected_batch": batch,
        "prompts": result.get("prompts"),
        "settings": settings,
        "timing": result.get("timing"),
        "candidates": [
            {
                "name": c["name"],
                "method": c["method"],
                "mean_acceptance_length": c["mean_acceptance_length"],
                "cpu_speedup": c["cpu_speedup"],
                "predicted_speedup": c.get("predicted_speedup"),
                "predicted_interval": c.get("predicted_interval"),
                "lossless": (c.get("identity") or {}).get("lossless"),
                "gate": "pass" if c["name"] not in misses else misses[c["name"]],
            }
            for c in result.get("candidates", [])
        ],
    }
