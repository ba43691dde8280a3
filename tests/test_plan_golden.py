"""Every shipped spec plans exactly as its golden file says (``tests/golden/plans/``).

Restructuring the code must not change a plan; a change meant to change one rewrites the golden
files (``python -m tests.golden.plans``) so that the difference shows in review.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.golden.plans import SPECS, golden_path, plan_json, read_golden


def first_difference(old: object, new: object, where: str = "") -> str | None:
    """The JSON path of the first place ``old`` and ``new`` differ, with both values; None if equal."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys()):
            if key not in old or key not in new:
                return f"{where}/{key}: only in the {'new' if key in new else 'golden'} plan"
            found = first_difference(old[key], new[key], f"{where}/{key}")
            if found:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return f"{where}: {len(old)} items in the golden plan, {len(new)} now"
        for index, (a, b) in enumerate(zip(old, new)):
            found = first_difference(a, b, f"{where}[{index}]")
            if found:
                return found
        return None
    return None if old == new else f"{where}: golden {old!r}, now {new!r}"


def test_every_shipped_spec_has_a_golden_plan() -> None:
    assert SPECS, "no spec under specs/"
    assert [golden_path(spec).is_file() for spec in SPECS] == [True] * len(SPECS)


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.stem)
def test_plan_json_is_unchanged(spec: Path, tmp_path: Path) -> None:
    difference = first_difference(read_golden(spec), plan_json(spec, tmp_path))
    assert difference is None, f"{spec.name}: {difference} (python -m tests.golden.plans rewrites the golden files)"


def test_first_difference_names_the_path() -> None:
    # equal documents: no difference
    assert first_difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}) is None
    # a changed leaf, a missing key, a shorter list
    assert first_difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}) == "/a[1]/b: golden 2, now 3"
    assert first_difference({"a": 1}, {"a": 1, "c": 0}) == "/c: only in the new plan"
    assert first_difference([1, 2], [1]) == ": 2 items in the golden plan, 1 now"
