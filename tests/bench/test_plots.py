"""The bench scripts' figures: each drawing function writes a PNG from what its script measured or kept
(docs/benchmarks.md shows them, with the command that drew each)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"

pytest.importorskip("matplotlib")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _drawn(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000


def test_costmodel_published_draws_held_out_against_published(tmp_path):
    bench = _script("costmodel_published")
    found = bench.observations()
    shipped, held_out = bench.calibrations(found)
    bench.plot(found, held_out, shipped["pytorch-eager"].bands, tmp_path / "published.png")
    _drawn(tmp_path / "published.png")


def test_trees_draws_the_kept_report(tmp_path):
    bench = _script("trees")
    bench.plot(json.loads(bench.REPORT.read_text()), tmp_path / "trees.png")
    _drawn(tmp_path / "trees.png")


def test_gemm_rows_draws_costs_by_rows(tmp_path):
    bench = _script("gemm_rows")
    rows = [1, 8, 16, 17, 32]
    bench.plot(rows, {"qkv (960 x 576)": [1.0, 1.1, 1.2, 1.4, 1.5]}, "bfloat16", tmp_path / "gemm.png")
    _drawn(tmp_path / "gemm.png")


def test_lora_fleet_draws_result_json(tmp_path):
    """As result.json holds it after a JSON round trip: the concurrencies are strings."""
    bench = _script("lora_fleet")

    def fleet(rss: float, stubs: float, rates: tuple[float, float]) -> dict:
        parts = {"pss_tritonserver_gib": 0.5, "pss_tokenizer_stubs_gib": 0.3, "pss_other_stubs_gib": stubs}
        return {"rss_gib": rss, "pss_gib": 0.8 + stubs, **parts, "stubs": 3, "startup_s": 9.0,
                "tokens_per_second": {"1": rates[0], "8": rates[1]}}  # fmt: skip

    result = {"base": fleet(2.0, 0.9, (9.0, 14.0)), "shared": fleet(2.6, 1.0, (9.5, 30.0))}
    result["merged"] = fleet(12.0, 5.0, (5.0, 10.0))
    bench.plot(json.loads(json.dumps(result)), tmp_path / "fleet.png")
    _drawn(tmp_path / "fleet.png")


def test_heads_curve_draws_every_kept_method(tmp_path):
    bench = _script("heads_curve")
    kept = json.loads(bench.REPORT.read_text())["methods"]
    assert set(kept) == {"eagle", "medusa"}
    bench.plot(kept, tmp_path / "curve.png")
    _drawn(tmp_path / "curve.png")


def test_heads_curve_fits_tokens_per_step_against_log2_tokens():
    bench = _script("heads_curve")
    a, b = bench.fit_log2([(1024, 1.5), (2048, 1.75), (4096, 2.0)])  # y = -1 + 0.25 * log2(x)
    assert (round(a, 6), round(b, 6)) == (-1.0, 0.25)
    assert bench.needed_tokens(a, b, 2.5) == 2**14  # -1 + 0.25 * 14 = 2.5
    assert bench.needed_tokens(1.5, 0.0, 2.0) is None  # a flat curve never reaches its goal
