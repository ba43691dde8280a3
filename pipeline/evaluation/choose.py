"""Choosing a method by measurement, and the release gates.

``speculative.method: best`` takes the candidate with the highest predicted GPU speedup at the
expected concurrency (``evaluation.batch_sizes[0]``); plain decoding when nothing beats it. Each
prediction carries the interval its method's held-out error puts around it
(``predicted_interval``, pipeline/costmodel/profile.py): when other candidates' intervals overlap the
top one's, the model's error cannot separate them, and the tie rule takes the one with less to
maintain among them: plain < Lookahead < Medusa < EAGLE (no heads; heads that share the lm_head; a
drafter layer), or the order of ``evaluation.prefer``; the highest point prediction within a method.
The ``release:`` gates then judge the chosen candidate:

* ``min_acceptance_length``: its measured mean acceptance length;
* ``min_speedup``: its predicted speedup at the expected concurrency, the interval's lower end by
  default (``speedup_bound: low``) or the point prediction (``speedup_bound: point``);
* ``max_batch_for_speculation``: speculation only when the expected concurrency is at most this;
* a candidate that is not lossless (outputs differ from plain decoding beyond the near-tie rule)
  never passes.

On a miss, ``on_fail: fallback`` takes the next best candidate that passes, down to plain decoding
(which passes by definition: it is what serving without speculation gives), and says so;
``on_fail: fail`` fails the variant (exit code 6, after every variant has been processed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline import methods

SpeedupBound = Literal["low", "point"]


@dataclass(frozen=True)
class Gates:
    min_acceptance_length: float | None = None
    min_speedup: float | None = None
    max_batch_for_speculation: int | None = None
    on_fail: str = "fallback"  # fallback | fail
    speedup_bound: SpeedupBound = "low"  # what min_speedup is checked against

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Gates:
        return cls(**data) if data else cls()


def interval(record: dict, batch: int) -> dict[str, float]:
    """{"point", "low", "high"} of a record's prediction at ``batch`` (point-only for records without
    intervals: plain decoding, or results written before they existed)."""
    point = record["predicted_speedup"][str(batch)]
    found = (record.get("predicted_interval") or {}).get(str(batch))
    return found or {"point": point, "low": point, "high": point}


def interval_text(record: dict, batch: int) -> str:
    i = interval(record, batch)
    if i["low"] == i["high"] == i["point"]:
        return f"{i['point']:.2f}x"
    return f"{i['point']:.2f}x ({i['low']:.2f}-{i['high']:.2f})"


def preference(prefer: Sequence[str] | None) -> tuple[str, ...]:
    """The tie rule's method order: ``prefer`` first, then the rest from least to most to maintain."""
    first = tuple(prefer or ())
    by_upkeep = sorted(methods.definitions(), key=lambda d: d.maintenance)
    return first + tuple(d.name for d in by_upkeep if d.name not in first)


def tie_break(records: list[dict], top: dict, batch: int, prefer: Sequence[str] | None) -> tuple[dict, list[str]]:
    """(the candidate the tie rule takes, the names whose intervals overlap ``top``'s) (see the module)."""
    mine = interval(top, batch)
    tied = [
        r
        for r in records
        if r is top or (interval(r, batch)["low"] <= mine["high"] and mine["low"] <= interval(r, batch)["high"])
    ]
    if len(tied) == 1:
        return top, []
    order = preference(prefer)
    rank = sorted(tied, key=lambda r: (order.index(r["method"]), -r["predicted_speedup"][str(batch)]))
    return rank[0], [r["name"] for r in tied]


@dataclass(frozen=True)
class Choice:
    candidate: str  # a candidate name ("plain", "eagle[...]", ...)
    method: str  # none | medusa | eagle | lookahead
    reason: str
    failed: str | None = None  # with on_fail: fail, the gate the best candidate missed (one line)
    misses: dict[str, str] = field(default_factory=dict)  # candidate -> the gate it missed
    not_separable: list[str] = field(default_factory=list)  # candidates tied with the best by the error
    speedup_bound: SpeedupBound = "low"

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "method": self.method,
            "reason": self.reason,
            "failed": self.failed,
            "misses": dict(self.misses),
            "not_separable": list(self.not_separable),
            "speedup_bound": self.speedup_bound,
        }


@dataclass(frozen=True)
class GateCheck:
    """One release gate judged on one candidate: what it asks, what was measured, and the miss line."""

    gate: str  # lossless | max_batch_for_speculation | min_acceptance_length | min_speedup
    threshold: str
    measured: str
    passed: bool
    miss: str | None = None  # the one line a failure is reported with (None when passed)


def gate_checks(record: dict, gates: Gates, batch: int) -> list[GateCheck]:
    """Every gate that applies to this candidate at the expected concurrency, in the order they are judged:
    losslessness always, then each gate the spec sets. Plain decoding passes them all by definition."""
    plain = record["method"] == methods.PLAIN
    al, speedup = record["mean_acceptance_length"], interval(record, batch)[gates.speedup_bound]
    lossless = bool(record["identity"]["lossless"])
    checks = [
        GateCheck(
            "lossless",
            "outputs equal plain decoding's (near-tie rule)",
            "lossless" if lossless else "differs from plain decoding",
            plain or lossless,
            None if plain or lossless else "lossless: its outputs differ from plain decoding beyond the near-tie rule",
        )
    ]
    if gates.max_batch_for_speculation is not None:
        limit = gates.max_batch_for_speculation
        ok = plain or batch <= limit
        miss = f"max_batch_for_speculation {limit}: the expected concurrency is {batch}"
        checks.append(
            GateCheck(
                "max_batch_for_speculation", str(limit), f"expected concurrency {batch}", ok, None if ok else miss
            )
        )
    if gates.min_acceptance_length is not None:
        ok = plain or al >= gates.min_acceptance_length
        checks.append(
            GateCheck(
                "min_acceptance_length",
                str(gates.min_acceptance_length),
                f"{al:.2f}",
                ok,
                None if ok else f"min_acceptance_length {gates.min_acceptance_length}: measured {al:.2f}",
            )
        )
    if gates.min_speedup is not None:
        ok = plain or speedup >= gates.min_speedup
        bounds = interval(record, batch)
        if gates.speedup_bound == "point" or bounds["low"] == bounds["high"] == bounds["point"]:  # no interval
            measured = f"{speedup:.2f}x at batch {batch}"
            miss = f"min_speedup {gates.min_speedup}: predicted {speedup:.2f}x at batch {batch}"
        else:
            measured = f"lower bound {speedup:.2f}x of {interval_text(record, batch)} at batch {batch}"
            miss = (
                f"min_speedup {gates.min_speedup}: predicted {interval_text(record, batch)} at batch {batch}, "
                f"lower bound {speedup:.2f}x"
            )
        checks.append(GateCheck("min_speedup", str(gates.min_speedup), measured, ok, None if ok else miss))
    if plain:  # what serving without speculation gives: no gate applies to it
        checks = [
            dataclasses.replace(c, measured=f"{c.measured} (plain decoding passes by definition)") for c in checks
        ]
    return checks


def gate_miss(record: dict, gates: Gates, batch: int) -> str | None:
    """Which gate this candidate misses at the expected concurrency (None: it passes)."""
    return next((check.miss for check in gate_checks(record, gates, batch) if not check.passed), None)


def choose(
    records: list[dict],
    batch: int,
    gpu: str,
    gates: Gates,
    planned: str | None = None,
    prefer: Sequence[str] | None = None,
) -> Choice:
    """The candidate to ship: best predicted speedup at ``batch``, the tie rule among those the model's
    error cannot separate from it, then the gates (see the module). ``planned``: a candidate fixed by the
    spec (method auto or explicit) instead of the best one; the gates judge it the same way."""
    ranked = sorted(records, key=lambda r: -r["predicted_speedup"][str(batch)])
    plain = next(r for r in records if r["method"] == methods.PLAIN)
    tie = ""
    tied: list[str] = []
    if planned is not None:
        best = next(r for r in records if r["name"] == planned)
    else:
        best = ranked[0] if ranked[0]["predicted_speedup"][str(batch)] > 1.0 else plain
        if best is not plain:
            taken, tied = tie_break(records, best, batch, prefer)
            if tied:
                order = " < ".join("plain" if m == methods.PLAIN else m for m in preference(prefer))
                tie = (
                    f"{', '.join(tied)} are not separable by the model's error at batch {batch} (their intervals "
                    f"overlap {best['name']}'s {interval_text(best, batch)}); tie rule {order}: {taken['name']}; "
                )
            best = taken

    def why(r: dict) -> str:
        return (
            f"predicted {interval_text(r, batch)} on {gpu} at batch {batch} with measured "
            f"acceptance length {r['mean_acceptance_length']:.2f}"
        )

    misses = {r["name"]: miss for r in ranked if (miss := gate_miss(r, gates, batch))}

    if best["method"] == methods.PLAIN:
        if planned is not None:
            reason = "planned: plain decoding"
        elif tie:
            reason = f"{tie}plain decoding"
        else:
            reason = (
                f"no candidate beats plain decoding on {gpu} at batch {batch} (best: {ranked[0]['name']}, "
                f"{why(ranked[0])})"
            )
        return Choice("plain", "none", reason, misses=misses, not_separable=tied, speedup_bound=gates.speedup_bound)
    if best["name"] not in misses:
        prefix = "planned " if planned is not None else ""
        return Choice(
            best["name"],
            best["method"],
            f"{tie}{prefix}{best['name']}: {why(best)}",
            misses=misses,
            not_separable=tied,
            speedup_bound=gates.speedup_bound,
        )
    missed = f"{best['name']} misses release gate {misses[best['name']]}"
    if gates.on_fail == "fail":
        return Choice(
            best["name"],
            best["method"],
            f"{tie}{missed}",
            failed=missed,
            misses=misses,
            not_separable=tied,
            speedup_bound=gates.speedup_bound,
        )
    passing = next(
        (
            r
            for r in ranked
            if r["name"] not in misses and (r["method"] == methods.PLAIN or r["predicted_speedup"][str(batch)] > 1.0)
        ),
        plain,
    )
    return Choice(
        passing["name"],
        passing["method"],
        f"{tie}{missed}; fell back to {passing['name']}"
        + (f": {why(passing)}" if passing["method"] != methods.PLAIN else ""),
        misses=misses,
        not_separable=tied,
        speedup_bound=gates.speedup_bound,
    )
