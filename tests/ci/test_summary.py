"""$GITHUB_STEP_SUMMARY: the Markdown engine and evaluate append for GitHub's run page."""

from __future__ import annotations

import json

from pipeline.release.ci.summary import append_step_summary, step_summary
from tests.ci.conftest import VARIANT, rechosen, run_record


def test_summary_has_variants_choice_gates_and_report_links(evaluated, tmp_path):
    text = step_summary(run_record(evaluated), base=tmp_path)
    assert text.startswith(f"## specdeploy engine `{VARIANT}`: a stage cannot run on this host (exit 3)\n")
    assert (
        f"| {VARIANT} | eagle | stopped at build (unavailable): trtllm-build is not installed on this host | "
        "evaluate ran 144.8 s, convert skipped 0.2 s, build unavailable, package not run |"
    ) in text
    assert f"### {VARIANT}: chose eagle2(top_k 10) (eagle)" in text
    assert "eagle2(top_k 10): predicted 1.53x on l40s at batch 1 with measured acceptance length 2.36." in text
    assert "| candidate | AL | CPU speedup | GPU b1 | GPU b8 | GPU b32 | gate |" in text
    assert "| **eagle2(top_k 10)** | 2.36 | 0.54x | 1.53x | 1.54x | 1.58x | pass |" in text
    missed = "min_acceptance_length 1.5: measured 1.23"
    assert f"| lookahead(4,3,4) | 1.23 | 0.51x | 1.23x | 1.23x | 1.23x | {missed} |" in text
    assert "- min_acceptance_length: pass, measured 2.36, threshold 1.5" in text
    assert "- min_speedup: pass, measured 1.53x at batch 1, threshold 1.1" in text
    assert f"Reports: [report.md](engines/{VARIANT}/evaluation/report.md)" in text
    (evaluated / "acceptance.png").write_bytes(b"")  # charts are linked when the stage wrote them
    assert f"[acceptance.png](engines/{VARIANT}/evaluation/acceptance.png)" in step_summary(
        run_record(evaluated), base=tmp_path
    )


def test_a_failed_gate_is_marked_and_the_summary_is_appended(evaluated, recorded, tmp_path):
    evaluation = rechosen(recorded, min_acceptance_length=3.0, on_fail="fail")
    (evaluated / "evaluation.json").write_text(json.dumps(evaluation))
    run = run_record(evaluated, exit_code=6, gate_failed=evaluation["choice"]["failed"])
    path = tmp_path / "step_summary.md"
    assert append_step_summary(run, {}) is None  # not on GitHub: nothing written
    append_step_summary(run, {"GITHUB_STEP_SUMMARY": str(path), "GITHUB_WORKSPACE": str(tmp_path)})
    append_step_summary(run, {"GITHUB_STEP_SUMMARY": str(path), "GITHUB_WORKSPACE": str(tmp_path)})
    text = path.read_text()
    assert text.count("## specdeploy engine") == 2
    assert "a release gate failed (exit 6)" in text
    assert "- min_acceptance_length: **FAILED**, measured 2.36, threshold 3.0" in text
    assert "stopped at evaluate (gate failed): eagle2(top_k 10) misses release gate min_acceptance_length 3.0" in text


def test_a_fall_back_to_plain_decoding_says_the_gates_do_not_apply(evaluated, recorded, tmp_path):
    evaluation = rechosen(recorded, min_acceptance_length=3.0)  # on_fail: fallback, and no candidate reaches 3
    assert evaluation["choice"]["candidate"] == "plain"
    (evaluated / "evaluation.json").write_text(json.dumps(evaluation))
    text = step_summary(run_record(evaluated), base=tmp_path)
    assert "- min_acceptance_length: pass, measured 1.00 (plain decoding passes by definition), threshold 3.0" in text
    assert "eagle2(top_k 10) misses release gate min_acceptance_length 3.0: measured 2.36; fell back to plain" in text
