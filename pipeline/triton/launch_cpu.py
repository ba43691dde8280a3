"""Start the real tritonserver 2.51 shipped in the nvidia-pytriton wheel, on CPU.

The wheel's server cannot run in place with our backend (its stubs live outside the Python
backend folder, and we must add a ``tensorrtllm`` backend), so a launch needs three things
(found by probing tritonserver 2.51 from nvidia-pytriton 0.7), each verified by leaving it out:

1. a copy of ``pytriton/tritonserver`` with the stub matching this interpreter in
   ``backends/python/`` (cached under ``<cache>/tritonserver/<pytriton>-py<X.Y>/``);
2. ``LD_LIBRARY_PATH`` = this interpreter's LIBDIR (the stub needs the *same patch build* of
   libpython, or stdlib C extensions such as ``_ssl`` fail) then ``nvidia_pytriton.libs``
   (the binary's RPATH is relative to site-packages, so a copy cannot find libcudart);
3. the venv's ``bin`` first on ``PATH`` (the stub's embedded Python finds its prefix there).

The TensorRT-LLM C++ backend does not exist on CPU; a Python-based backend named
``tensorrtllm`` (a folder ``<backend-dir>/tensorrtllm/model.py``) takes its place, so the
model repository is byte-for-byte the one a GPU server loads.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import TracebackType

import pipeline
from pipeline.errors import InputError, StageError
from pipeline.spec.document import HTTP_DEFAULT_MAX_REQUEST_BYTES
from pipeline.triton.http_front import READ_HEADER_TIMEOUT_S, HttpFront, HttpFrontConfig, accepts, free_loopback_port

log = logging.getLogger(__name__)

REFERENCE_BACKEND_MODULE = "pipeline.runtime.triton.backend"
PROJECT_ROOT = Path(pipeline.__file__).resolve().parent.parent
# Installed as <backend-dir>/tensorrtllm/model.py: a re-export, so the server always runs the
# reference backend of the checkout that started it, not a stale copy. The Python backend's stub
# ignores PYTHONPATH (its sys.path is the interpreter's and site-packages'), so an editable install
# of another checkout would win: the shim puts this checkout first itself.
BACKEND_SHIM = f'''"""specdeploy: the CPU reference backend, loaded by Triton as backend "tensorrtllm"."""
import sys

sys.path.insert(0, {str(PROJECT_ROOT)!r})
from {REFERENCE_BACKEND_MODULE} import TritonPythonModel  # noqa: E402,F401
'''
# Started through this one-liner so the server gets SIGTERM if we die without stopping it (a
# SIGKILL, a crash): Linux's parent-death signal survives the exec. Not preexec_fn, which can
# deadlock in a process that already runs threads (gRPC clients do).
_EXEC_WITH_PARENT_DEATH_SIGNAL = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0); "  # PR_SET_PDEATHSIG
    "os.getppid() == int(sys.argv[1]) or sys.exit(1); "  # the parent already died: do not start
    "os.execv(sys.argv[2], sys.argv[2:])"
)
LOG_TAIL_LINES = 30
EXIT_TIMEOUT_SECONDS = 30  # Triton's own drain-and-unload limit on SIGTERM


@dataclass(frozen=True)
class CpuServerConfig:
    repositories: tuple[Path, ...]
    cache_dir: Path
    host: str = "127.0.0.1"
    http_port: int = 8000
    # serving.http: off by default; on, Triton's HTTP port is private and a Caddy front on http_port
    # refuses bodies over http_max_request_bytes (tritonserver 2.51 has no limit, server#5840).
    http: bool = False
    http_max_request_bytes: int = HTTP_DEFAULT_MAX_REQUEST_BYTES
    http_read_header_timeout_s: float = READ_HEADER_TIMEOUT_S  # the front cuts off headers not read whole by then
    grpc_port: int = 8001
    metrics_port: int = 8002
    # A Python file installed as the tensorrtllm backend; None means the reference backend.
    backend_model: Path | None = None
    log_file: Path | None = None
    ready_timeout: float = 300.0
    models: tuple[str, ...] = ()  # models that must be READY before start() returns
    log_verbose: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)


def reference_backend_available() -> bool:
    try:
        return importlib.util.find_spec(REFERENCE_BACKEND_MODULE) is not None
    except ImportError:  # pipeline.runtime itself missing
        return False


def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _python_version() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def prepare_runtime(cache_dir: Path) -> Path:
    """The cached server tree for this pytriton version and Python (built once, atomically)."""
    try:
        version = metadata.version("nvidia-pytriton")
    except metadata.PackageNotFoundError:
        raise StageError("nvidia-pytriton is not installed; run `make setup`") from None
    source = _site_packages() / "pytriton" / "tritonserver"
    stub = source / "python_backend_stubs" / _python_version() / "triton_python_backend_stub"
    if not (source / "bin" / "tritonserver").is_file() or not stub.is_file():
        raise StageError(
            f"{source}: no tritonserver binary or no Python {_python_version()} stub in nvidia-pytriton {version}"
        )
    target = Path(cache_dir).resolve() / "tritonserver" / f"{version}-py{_python_version()}"
    if (target / "bin" / "tritonserver").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        for part in ("bin", "backends", "caches"):
            shutil.copytree(source / part, tmp / part, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(stub, tmp / "backends" / "python" / stub.name)
        try:
            os.replace(tmp, target)
        except OSError:  # another process published it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    libs = [libdir, str(_site_packages() / "nvidia_pytriton.libs")]
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = ":".join([p for p in libs if p and Path(p).is_dir()] + ([old] if old else []))
    env["PATH"] = os.pathsep.join([sysconfig.get_path("scripts"), env.get("PATH", "")])
    # For processes that honour it; the Python backend's stub does not (BACKEND_SHIM sets its path).
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["HF_HUB_OFFLINE"] = "1"  # pre/postprocessing load tokenizers; never reach a model hub
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ inside the (packaged, maybe read-only) repository
    env["TRANSFORMERS_OFFLINE"] = "1"
    env.update(extra or {})
    return env


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise InputError(
                f"{host}:{port} is not free ({exc.strerror}); is another tritonserver running? "
                "pick other ports with --grpc-port/--http-port/--metrics-port"
            ) from None


def _check_repositories(repositories: Sequence[Path]) -> None:
    for repo in repositories:
        if not any(repo.glob("*/config.pbtxt")):
            raise InputError(
                f"{repo}: not a Triton model repository (no */config.pbtxt); run `specdeploy engine SPEC` to package it"
            )


class CpuTritonServer:
    """A tritonserver subprocess; ``with CpuTritonServer(config) as server:`` waits until ready."""

    def __init__(self, config: CpuServerConfig) -> None:
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        self.front: HttpFront | None = None  # the bounded HTTP front, with serving.http
        self._http_upstream: int | None = None  # Triton's own HTTP port, on 127.0.0.1 behind the front
        self._workdir: Path | None = None
        self._shm_prefix = f"specdeploy{os.getpid()}x{config.grpc_port}_"
        self.log_file = config.log_file or (
            Path(config.cache_dir).resolve() / "tritonserver" / "logs" / f"tritonserver-{config.grpc_port}.log"
        )

    @property
    def grpc_url(self) -> str:
        return f"{_client_host(self.config.host)}:{self.config.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{_client_host(self.config.host)}:{self.config.http_port}"

    def command(self, runtime: Path, backend_dir: Path) -> list[str]:
        c = self.config
        argv = [str(runtime / "bin" / "tritonserver")]
        argv += [f"--model-repository={repo.resolve()}" for repo in c.repositories]
        argv += [
            f"--backend-directory={backend_dir}",
            f"--cache-directory={runtime / 'caches'}",
            *(
                ["--http-address=127.0.0.1", f"--http-port={self._http_upstream or c.http_port}"]
                if c.http
                else ["--allow-http=false"]
            ),
            f"--grpc-address={c.host}",
            f"--grpc-port={c.grpc_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--allow-cpu-metrics=true",
            f"--metrics-address={c.host}",
            f"--metrics-port={c.metrics_port}",
            # The config files were validated by the emitter; auto-complete would only hide mistakes.
            "--disable-auto-complete-config",
            "--exit-on-error=true",
            # Unloading a Python model that imported torch can take >10 s on a busy host.
            f"--exit-timeout-secs={EXIT_TIMEOUT_SECONDS}",
            # Unique per server, so two servers on one host never share shared-memory regions.
            f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}",
            # Python models import torch/transformers on start; on a busy 2-core host that outlasts
            # the default 30 s the backend waits for a stub, and the whole server exits.
            f"--backend-config=python,stub-timeout-seconds={max(30, int(c.ready_timeout))}",
            f"--log-verbose={c.log_verbose}",
        ]
        return argv

    def _backend_dir(self, runtime: Path) -> Path:
        _remove_stale_workdirs(runtime.parent)
        self._workdir = Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=runtime.parent))
        backends = self._workdir / "backends"
        (backends / "tensorrtllm").mkdir(parents=True)
        (backends / "python").symlink_to(runtime / "backends" / "python", target_is_directory=True)
        model = backends / "tensorrtllm" / "model.py"
        if self.config.backend_model is not None:
            shutil.copy2(self.config.backend_model, model)
        elif reference_backend_available():
            model.write_text(BACKEND_SHIM)
        else:
            raise StageError(
                f"the reference backend ({REFERENCE_BACKEND_MODULE.replace('.', '/')}.py) is not in "
                "this checkout; the CPU server cannot serve the tensorrt_llm model without it"
            )
        return backends

    def start(self) -> CpuTritonServer:
        c = self.config
        _check_repositories(c.repositories)
        for port in ((c.http_port,) if c.http else ()) + (c.grpc_port, c.metrics_port):
            check_port_free(c.host, port)
        runtime = prepare_runtime(c.cache_dir)
        backend_dir = self._backend_dir(runtime)
        self._http_upstream = free_loopback_port() if c.http else None
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "wb") as log:
            # Own session: Ctrl-C in the terminal reaches us, not the server; we stop it in order.
            argv = [
                sys.executable,
                "-I",
                "-c",
                _EXEC_WITH_PARENT_DEATH_SIGNAL,
                str(os.getpid()),
                *self.command(runtime, backend_dir),
            ]
            self.process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=server_env(c.extra_env),
                cwd=self._workdir,
                start_new_session=True,
            )
        try:
            self.wait_ready()
            if c.http:
                self._start_front()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_front(self) -> None:
        """Caddy on (host, http_port) before Triton's private HTTP port, once that accepts connections
        (readiness is asked over gRPC; Triton's HTTP endpoint may open a moment later)."""
        assert self._http_upstream is not None and self._workdir is not None
        deadline = time.monotonic() + 30
        while not accepts("127.0.0.1", self._http_upstream):
            if not self.is_alive() or time.monotonic() > deadline:
                raise StageError(
                    f"tritonserver's HTTP endpoint did not open: {self.death()} (full log: {self.log_file})"
                )
            time.sleep(0.1)
        front = HttpFrontConfig(
            self.config.host,
            self.config.http_port,
            self._http_upstream,
            self.config.http_max_request_bytes,
            read_header_timeout_s=self.config.http_read_header_timeout_s,
        )
        log = self.log_file.with_name(f"{self.log_file.stem}-http-front.log")
        self.front = HttpFront(front, self._workdir, log, _EXEC_WITH_PARENT_DEATH_SIGNAL)
        self.front.start()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.config.ready_timeout
        while True:
            code = self.process.poll() if self.process else -1
            if code is not None:
                raise StageError(f"{self.death()} while starting (full log: {self.log_file})")
            if self._ready(self.config.models):
                return
            if time.monotonic() > deadline:
                raise StageError(
                    f"tritonserver not ready after {self.config.ready_timeout:.0f} s: "
                    f"{self.failure_reason()} (full log: {self.log_file})"
                )
            time.sleep(0.25)

    def _ready(self, models: Sequence[str] = ()) -> bool:
        """Server and ``models`` ready, asked over gRPC (HTTP is off unless serving.http)."""
        from tritonclient.utils import InferenceServerException

        from pipeline.client.stream import grpc_client

        try:
            with grpc_client(self.grpc_url) as client:
                return bool(client.is_server_ready(client_timeout=2)) and all(
                    client.is_model_ready(name, client_timeout=2) for name in models
                )
        except (InferenceServerException, OSError):
            return False

    def is_alive(self) -> bool:
        """tritonserver runs, and so does its HTTP front when it has one."""
        triton = self.process is not None and self.process.poll() is None
        return triton and (self.front is None or self.front.is_alive())

    def death(self) -> str:
        """What ended the server, for one line: ``tritonserver died (SIGSEGV)`` (Triton 2.51 re-raises a
        fatal signal after printing its stack, so the exit status names it), ``tritonserver exited with
        code N: <first error line>``, or the HTTP front's end."""
        code = self.process.poll() if self.process is not None else None
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"tritonserver died ({name})"
        if code is not None:
            fatal = _FATAL_SIGNAL.search(self._log_text())  # what its handler printed, if the status lost it
            if fatal is not None and int(fatal.group(1)) in _SIGNAL_NAMES:
                return f"tritonserver died ({_SIGNAL_NAMES[int(fatal.group(1))]})"
            return f"tritonserver exited with code {code}: {self.failure_reason()}"
        if self.front is not None and not self.front.is_alive():
            return f"its HTTP front (Caddy) stopped: {self.front.failure_reason()} (log: {self.front.log_file})"
        return "tritonserver is running"

    def is_ready(self) -> bool:
        return self.is_alive() and self._ready()

    def failure_reason(self) -> str:
        """One line: the first real error in the log (usually the cause), else its last line."""
        try:
            text = [line for line in self.log_file.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "no log"
        errors = [line for line in text if _is_error_line(line)]
        text = [line for line in text if not _STACK_FRAME.match(line)] or text
        line = errors[0] if errors else (text[-1] if text else "empty log")
        return " ".join(line.split())[:1000]

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """Error lines first (the cause is often far above the shutdown chatter), then the last lines."""
        try:
            text = self.log_file.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        text = [line for line in text if line.strip() and not line.startswith(("+--", "| "))]
        errors = [line for line in text if _is_error_line(line) and line not in text[-lines:]]
        return "\n".join(errors[-lines:] + text[-lines:])

    def stop(self, timeout: float = EXIT_TIMEOUT_SECONDS + 15) -> int | None:
        """SIGTERM (Triton drains in-flight requests), wait, then SIGKILL the server's process group.

        Triton 2.51 keeps an ensemble request whose client cancelled it mid-stream (gRPC
        ``stop_stream(cancel_requests=True)``) counted in flight for good, though its composing
        models finished it: the drain then waits out the whole exit timeout (cancellation reaches
        only the ensemble steps scheduled after it, triton-inference-server/core#263). When the
        log shows, for LEAK_TICKS drain ticks in a row, only ensembles in flight and none of the
        models they are made of, nothing is left to drain and the server is ended now.
        """
        if self.front is not None:  # first, so no request reaches a server that is draining
            self.front.stop()
            self.front = None
        process, self.process = self.process, None
        code = None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            code = self._wait_draining(process, timeout)
            # Python stubs are the server's children in its session; take any straggler with it.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if code is None:
                code = process.wait()
        self._cleanup()
        return code

    def _wait_draining(self, process: subprocess.Popen[bytes], timeout: float) -> int | None:
        ensembles = ensemble_names(self.config.repositories)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return process.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            if ensembles and only_leaked_ensembles(self._log_text(), ensembles):
                log.warning(
                    "tritonserver: only cancelled ensemble requests are left in flight (a Triton 2.51 "
                    "leak, triton-inference-server/core#263); ending the server instead of waiting %d s",
                    EXIT_TIMEOUT_SECONDS,
                )
                return None
        return None

    def _log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def _cleanup(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        for region in Path("/dev/shm").glob(f"{self._shm_prefix}*"):  # left by a killed server
            region.unlink(missing_ok=True)

    def __enter__(self) -> CpuTritonServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


_FATAL_SIGNAL = re.compile(r"^Signal \((\d+)\) received\.$", re.MULTILINE)  # Triton's fatal-signal handler
_SIGNAL_NAMES = {int(signal.SIGSEGV): "SIGSEGV", int(signal.SIGABRT): "SIGABRT", int(signal.SIGBUS): "SIGBUS"}
_STACK_FRAME = re.compile(r"^\s*\d+# ")  # a line of the stack trace that follows it
LEAK_TICKS = 3  # consecutive one-second drain ticks with only ensembles in flight
_DRAIN_TICK = re.compile(r'"Timeout \d+: Found \d+ model versions that have in-flight inferences"')
_IN_FLIGHT = re.compile(r'"Model \'([^\']+)\' \(version \d+\) has \d+ in-flight inferences"')


def only_leaked_ensembles(log_text: str, ensembles: set[str]) -> bool:
    """True when the last LEAK_TICKS drain ticks of Triton's shutdown log name ensembles only."""
    ticks = _DRAIN_TICK.split(log_text)[1:]  # the text after each tick line
    if len(ticks) < LEAK_TICKS + 1:  # the last tick may still be being written
        return False
    for tick in ticks[-LEAK_TICKS - 1 : -1]:
        models = set(_IN_FLIGHT.findall(tick))
        if not models or not models <= ensembles:
            return False
    return True


def ensemble_names(repositories: tuple[Path, ...]) -> set[str]:
    """Models with ``platform: "ensemble"`` in these repositories."""
    names = set()
    for repo in repositories:
        for path in Path(repo).glob("*/config.pbtxt"):
            try:
                if re.search(r'^platform:\s*"ensemble"', path.read_text(errors="replace"), re.MULTILINE):
                    names.add(path.parent.name)
            except OSError:
                continue
    return names


def _remove_stale_workdirs(folder: Path) -> None:
    """Backend folders of launchers that died without stopping (their pid is in the name)."""
    for workdir in folder.glob("run-*-*"):
        pid = workdir.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(workdir, ignore_errors=True)


def _client_host(host: str) -> str:
    # A server bound to all interfaces is still reached through loopback from this host.
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _is_error_line(line: str) -> bool:
    # glog format: E<MMDD> hh:mm:ss... ; CUDA/NVML/DCGM complaints are expected on CPU.
    harmless = ("CudaDriverHelper", "CUDA driver", "NVML", "DCGM", "cuda")
    return line[:1] == "E" and line[1:5].isdigit() and not any(word in line for word in harmless)
