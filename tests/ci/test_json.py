"""--json: one documented shape per command, stdout holding the JSON document alone."""

from __future__ import annotations

import json
import sys

import xmlschema
from junitparser import Error, JUnitXml, Skipped

import pipeline.release.ci
from tests.ci.conftest import SPEC, VARIANT
from tests.conftest import REPO

SCHEMA = REPO / "tests" / "data" / "junit" / "junit-10.xsd"
STAGE_KEYS = {"stage", "state", "seconds", "message"}
VARIANT_KEYS = {"name", "method", "exit_code", "stopped_at", "stages", "evaluation"}


def test_engine_json_junit_and_step_summary(cli, write_spec, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    spec = write_spec("name: big\nmodel: {path: /nonexistent/llama, preset: llama-3.1-8b}\n")
    rc, out, err = cli("engine", str(spec), "--json", "--junit-xml", str(tmp_path / "junit" / "engine.xml"))
    assert rc == 3
    body = json.loads(out)  # stdout is the document alone: the progress lines went to stderr
    assert "[big] convert: the model weights are not on this host" in err
    assert set(body) == {"command", "spec", "spec_file", "exit_code", "manifest", "repository", "variants"}
    assert (body["command"], body["spec"], body["exit_code"], body["repository"]) == ("engine", "big", 3, None)
    (variant,) = body["variants"]
    assert set(variant) == VARIANT_KEYS and all(set(s) == STAGE_KEYS for s in variant["stages"])
    assert [(s["stage"], s["state"]) for s in variant["stages"]] == [
        ("convert", "unavailable"),
        ("build", "not run"),
        ("package", "not run"),
    ]
    assert variant["stopped_at"] == "convert" and variant["exit_code"] == 3 and variant["evaluation"] is None
    assert "weights are not on this host" in variant["stages"][0]["message"]

    xmlschema.validate(str(tmp_path / "junit" / "engine.xml"), str(SCHEMA))
    cases = {c.name: c for suite in JUnitXml.fromfile(str(tmp_path / "junit" / "engine.xml")) for c in suite}
    assert all(isinstance(cases[s].result[0], Skipped) for s in ("convert", "build", "package"))

    text = summary.read_text()
    assert text.startswith("earlier step\n")  # appended, as GitHub expects of every step
    assert "## specdeploy engine `big`: a stage cannot run on this host (exit 3)" in text
    assert f"| big | {variant['method']} | stopped at convert (unavailable): the model weights are not on" in text

    # verify --json on the manifest that run wrote: nothing built, nothing to check; then a listed file gone.
    rc, out, _ = cli("verify", body["manifest"], "--json")
    assert rc == 0 and json.loads(out) == {"manifest": body["manifest"], "checked": 0, "ok": True, "problems": []}
    manifest = json.loads(open(body["manifest"]).read())
    gone = tmp_path / "gone.safetensors"
    manifest["variants"]["big"]["outputs"] = {"convert": {"files": {str(gone): "0" * 64}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    rc, out, err = cli("verify", str(tmp_path / "manifest.json"), "--json")
    assert rc == 1 and json.loads(out)["problems"] == [f"{gone}: missing (big convert)"]
    assert json.loads(out)["ok"] is False and json.loads(out)["checked"] == 1


def test_engine_that_stops_with_an_error_still_writes_its_junit(cli, write_spec, tmp_path):
    spec = write_spec("name: bad\nmodel: {path: /nonexistent/llama, preset: llama-3.1-8b}\nparallel: {tq: 2}\n")
    rc, out, err = cli("engine", str(spec), "--junit-xml", str(tmp_path / "engine.xml"))
    assert rc == 2 and "tq" in err
    xmlschema.validate(str(tmp_path / "engine.xml"), str(SCHEMA))
    (case,) = [c for suite in JUnitXml.fromfile(str(tmp_path / "engine.xml")) for c in suite]
    assert isinstance(case.result[0], Error) and "tq" in case.result[0].message
    # A JUnit path that cannot be written is refused before the run, in one line (exit 4).
    (tmp_path / "file").write_text("")
    rc, _, err = cli("engine", str(spec), "--junit-xml", str(tmp_path / "file" / "engine.xml"))
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert rc == 4 and len(errors) == 1 and "its folder cannot take the report" in errors[0], err
    # Another tool's JUnit file that merely mentions specdeploy is not specdeploy's to replace.
    other = tmp_path / "pytest.xml"
    other.write_text('<?xml version="1.0"?><testsuites name="pytest tests"><testsuite name="specdeploy"/></testsuites>')
    rc, _, err = cli("engine", str(spec), "--junit-xml", str(other))
    assert rc == 4 and "specdeploy did not write" in err and "pytest tests" in other.read_text()


def test_report_json(cli, evaluated):
    rc, out, err = cli("report", str(SPEC), "--json")
    assert rc == 0, err
    body = json.loads(out)
    assert body["spec"] == VARIANT
    (variant,) = body["variants"]
    assert variant == {
        "name": VARIANT,
        "evaluated": True,
        "choice": "eagle2(top_k 10)",
        "method": "eagle",
        "mean_acceptance_length": variant["mean_acceptance_length"],
        "predicted_speedup": variant["predicted_speedup"],
        "batch": 1,
        "gpu": "l40s",
        "release": "pass",
        "failed": None,
        "reason": "eagle2(top_k 10): predicted 1.53x on l40s at batch 1 with measured acceptance length 2.36",
        "reports": [str(evaluated / "report.md")],
    }
    assert round(variant["mean_acceptance_length"], 2) == 2.36 and round(variant["predicted_speedup"], 2) == 1.53


def test_validate_json(cli):
    rc, out, err = cli("validate", "llama8b-fleet.yaml", "--json")
    assert rc == 0, err
    body = json.loads(out)
    assert set(body) == {"spec", "spec_file", "ok", "variants"} and body["ok"] is True
    assert all(set(v) == {"name", "method", "reason", "notes"} for v in body["variants"])
    assert len(body["variants"]) > 1


def test_build_dry_run_json(cli):
    rc, out, err = cli("build", "llama70b-eagle.yaml", "--dry-run", "--json")
    assert rc == 0, err
    (variant,) = json.loads(out)["variants"]
    # kubernetes_launch: the container's argv in engines/<spec>/deploy/ (target tensorrt)
    assert set(variant) == {"name", "trtllm_build", "gpu_launch", "kubernetes_launch"}
    assert variant["trtllm_build"][0] == "trtllm-build"


def test_prepare_model_json(cli, smollm2_dir):
    rc, out, err = cli("prepare-model", "--json")
    assert rc == 0, err
    assert json.loads(out) == {"model_dir": str(smollm2_dir)}


def test_engine_without_junitparser_installed(cli, write_spec, tmp_path, monkeypatch):
    # Containers install specdeploy --no-deps: the run needs junitparser only for --junit-xml, and says so.
    monkeypatch.setitem(sys.modules, "junitparser", None)
    monkeypatch.delitem(sys.modules, "pipeline.release.ci.junit", raising=False)
    monkeypatch.delattr(pipeline.release.ci, "junit", raising=False)  # as if never imported
    spec = write_spec("name: big\nmodel: {path: /nonexistent/llama, preset: llama-3.1-8b}\n")
    rc, out, err = cli("engine", str(spec), "--json")
    assert rc == 3 and json.loads(out)["exit_code"] == 3, err
    rc, out, err = cli("engine", str(spec), "--junit-xml", str(tmp_path / "j.xml"))
    assert rc == 2 and err.splitlines()[-1] == "error: --junit-xml needs junitparser: pip install 'junitparser==5.0.3'"
