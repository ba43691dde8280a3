"""``--junit-xml PATH``: a run as JUnit XML, which GitHub, GitLab and Jenkins show as checks.

One ``<testsuite>`` per variant, named ``<spec>.<variant>``:

* one test case per stage (classname ``<spec>.<variant>.stages``): ran or up to date passes; a stage
  that cannot run on this host (exit 3), and the stages after a stop, are skipped with the reason; a
  stage that failed is an error with its message;
* one test case per release gate judged on the evaluated choice (classname ``<spec>.<variant>.release``):
  losslessness always, and each gate the spec's ``release:`` sets. A failed gate is a failure whose
  message is the gate's line (``min_acceptance_length 1.5: measured 1.23``) and whose text has the
  candidate, the measured value and the threshold.

The format follows the JUnit schema Jenkins' xUnit plugin publishes (``junit-10.xsd``, which the tests
validate against); the XML is written by junitparser, into a temporary file renamed into place.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from pipeline.errors import host_error
from pipeline.evaluation.choose import Gates, gate_checks
from pipeline.evaluation.result import GATE_FAILED
from pipeline.release.ci.records import FAILED, NOT_RUN, UNAVAILABLE, RunRecord, VariantRecord

STAGE_SHOWN = {"ran": "ran", "skipped": "up to date (skipped by its fingerprint)", GATE_FAILED: "ran"}


def junit_document(run: RunRecord) -> JUnitXml:
    document = JUnitXml(f"specdeploy {run.command} {run.spec}")
    for variant in run.variants:
        document.add_testsuite(_variant_suite(run, variant))
    suites = list(document)
    # The root's counts, set by hand: junitparser would also write `skipped`, which the schema does not allow
    # on <testsuites> (each <testsuite> has its own).
    document.tests = sum(s.tests for s in suites)
    document.failures = sum(s.failures for s in suites)
    document.errors = sum(s.errors for s in suites)
    document.time = round(sum(s.time for s in suites), 3)
    return document


def _variant_suite(run: RunRecord, variant: VariantRecord) -> TestSuite:
    suite = TestSuite(f"{run.spec}.{variant.name}")
    for stage in variant.stages:
        case = TestCase(stage.stage, f"{run.spec}.{variant.name}.stages", stage.seconds or 0.0)
        if stage.state == UNAVAILABLE:
            case.result = [Skipped(f"cannot run on this host: {stage.message}", "unavailable")]
        elif stage.state == NOT_RUN:
            case.result = [Skipped(stage.message or "not run", "not-run")]
        elif stage.state == FAILED:
            case.result = [Error(stage.message or "the stage failed", "stage-failed")]
        else:
            case.system_out = STAGE_SHOWN.get(stage.state, stage.state)
        suite.add_testcase(case)
    for case in _gate_cases(run, variant):
        suite.add_testcase(case)
    suite.add_property("method", variant.method)
    suite.add_property("exit_code", str(variant.exit_code))
    suite.update_statistics()
    return suite


def _gate_cases(run: RunRecord, variant: VariantRecord) -> list[TestCase]:
    evaluation = variant.evaluation()
    if evaluation is None:
        return []
    choice = evaluation["choice"]
    batch = evaluation["settings"]["batch_sizes"][0]
    chosen = next(c for c in evaluation["candidates"] if c["name"] == choice["candidate"])
    cases = []
    for check in gate_checks(chosen, Gates.from_dict(evaluation.get("release")), batch):
        case = TestCase(f"release gate {check.gate}", f"{run.spec}.{variant.name}.release", 0.0)
        detail = f"candidate {chosen['name']}\nmeasured {check.measured}\nthreshold {check.threshold}"
        if check.passed:
            case.system_out = f"{detail}\nchoice: {choice['reason']}"
        else:
            failure = Failure(check.miss, "release-gate")
            failure.text = detail
            case.result = [failure]
        cases.append(case)
    return cases


def write_junit(run: RunRecord, path: Path) -> Path:
    """The JUnit XML of ``run`` at ``path`` (its folder is created), complete or not at all."""
    return _write(junit_document(run), path)


def write_error_junit(command: str, spec: str, message: str, path: Path) -> Path:
    """A JUnit XML of one errored test case, for a run that stopped with an error before it had any result
    (bad input, a stage's tool failing): CI still shows a failed check, with the error's line."""
    document = JUnitXml(f"specdeploy {command} {spec}")
    suite = TestSuite(f"{spec}.{command}")
    case = TestCase(command, f"{spec}.{command}", 0.0)
    case.result = [Error(message, "error")]
    suite.add_testcase(case)
    suite.update_statistics()
    document.add_testsuite(suite)
    document.tests, document.failures, document.errors, document.time = 1, 0, 1, 0.0
    return _write(document, path)


def _write(document: JUnitXml, path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        document.write(str(tmp), pretty=True)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):  # the folder may be what refused
            tmp.unlink(missing_ok=True)
        raise host_error(exc, f"writing the JUnit XML report {path}") from None
    return path
