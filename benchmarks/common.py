"""Helpers shared by the benchmarks: start a gateway, time things, write results."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
BANNER = re.compile(r"^polygate: (\S+) listening on (\S+):(\d+)$")


class Gateway:
    """``gateway serve`` in a subprocess on a fresh data dir, ports read from its banner."""

    def __init__(self, protocols: Sequence[str], args: Sequence[str] = ()):
        self.tmp = tempfile.TemporaryDirectory(prefix="polygate-bench-")
        exe = os.path.join(os.path.dirname(sys.executable), "gateway")
        cmd = [exe, "serve", "--data-dir", self.tmp.name, "--protocols", ",".join(protocols),
               "--log-level", "WARNING", *[f"--listen={p}=127.0.0.1:0" for p in protocols], *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.ports: dict[str, int] = {}
        while len(self.ports) < len(protocols):
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("gateway failed to start")
            if match := BANNER.match(line.strip()):
                self.ports[match.group(1)] = int(match.group(3))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.tmp.cleanup()

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_result(name: str, result: dict) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    result = {"benchmark": name, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, **result}
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    return path


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)
