"""Where the evaluate stage's result lives, and what later steps read from it."""

from __future__ import annotations

import json
from pathlib import Path

RESULT_FILE = "evaluation.json"
RELEASE_EXIT_CODE = 6  # a release gate failed (release.on_fail: fail); 4 and 5 are filesystem errors


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
