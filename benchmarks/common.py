"""Helpers shared by the benchmarks: start a gateway, time things, write results."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Sequence

from gateway.launcher import GatewayProcess

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


class Gateway(GatewayProcess):
    """``gateway serve`` in a subprocess on a fresh data dir, ports in ``ports``, started at once."""

    def __init__(self, protocols: Sequence[str], args: Sequence[str] = ()):
        super().__init__(None, protocols, ("--log-level", "WARNING", *args))
        self.start()

    def close(self) -> None:
        self.__exit__(None, None, None)


def write_result(name: str, result: dict) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    result = {"benchmark": name, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, **result}
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    return path


def plot_path(name: str) -> str | None:
    """Where a benchmark's plot goes (``results/<name>.png``), or ``None`` (said once) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        progress("no plot: matplotlib is not installed (make bench installs it)")
        return None
    os.makedirs(RESULTS, exist_ok=True)
    return os.path.join(RESULTS, f"{name}.png")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far, from /proc (what a server costs,
    whatever the clients beside it on the same cores cost)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
