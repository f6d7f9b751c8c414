"""Helpers shared by the benchmarks: start a gateway, time things and meter servers' CPU, write results."""

from __future__ import annotations

import contextlib
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
    whatever the clients beside it on the same cores cost), to /proc/<pid>/stat's tick
    (10 ms): every thread the process ever had, the ended ones too."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def live_threads_cpu_seconds(pid: int) -> float:
    """CPU time the threads a process has now have used so far, to the nanosecond (the first field
    of each /proc/<pid>/task/<tid>/schedstat); threads that have ended are left out."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        # a thread that ends meanwhile is left out
        with contextlib.suppress(FileNotFoundError, ProcessLookupError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def cpu_used(before: tuple[float, float], after: tuple[float, float]) -> float:
    """CPU seconds between two ``(cpu_seconds, live_threads_cpu_seconds)`` readings of a process:
    the nanosecond figure, unless it falls short of the tick figure by more than the ticks' own
    rounding (the user and system fields, each cut to a tick): threads that ended in between."""
    ticks, precise = after[0] - before[0], after[1] - before[1]
    return precise if abs(ticks - precise) <= 2 / os.sysconf("SC_CLK_TCK") + 0.001 else ticks


def machine_ticks() -> tuple[int, int]:
    """(idle, total) CPU time of the whole machine so far, all cores, in /proc/stat's ticks
    (idle counts iowait too: a core waiting on a disk could run something else)."""
    with open("/proc/stat") as f:
        ticks = [int(t) for t in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[3] + ticks[4], sum(ticks)


class Meter:
    """Over a ``with`` block: its wall-clock ``seconds``, in ``used`` the CPU seconds spent by
    each process named in the constructor (``name=pid``; see ``cpu_used``), and in ``machine_idle`` the share
    (0-1) of the whole machine's CPU time that was idle, whoever ran on it."""

    def __init__(self, **pids: int):
        self.pids = pids
        self.used: dict[str, float] = {}

    def reading(self) -> dict[str, tuple[float, float]]:
        # this process itself (clients metered beside the servers) has a nanosecond clock of its own
        return {name: (time.process_time(),) * 2 if pid == os.getpid()
                else (cpu_seconds(pid), live_threads_cpu_seconds(pid)) for name, pid in self.pids.items()}

    def __enter__(self) -> Meter:
        self.before = self.reading()
        self.machine_before = machine_ticks()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
        self.used = {name: cpu_used(self.before[name], now) for name, now in self.reading().items()}
        (idle, total), (idle0, total0) = machine_ticks(), self.machine_before
        self.machine_idle = (idle - idle0) / (total - total0) if total > total0 else 0.0


CPU_CGROUPS = "/sys/fs/cgroup/cpu"  # where cgroup v1 mounts its cpu controller


class CpuCap:
    """A cgroup of its own (cgroup v1's ``cpu`` controller, as root) for one process and its
    threads, whose CPU ``limit`` caps to a number of cores by CFS bandwidth control: ``cores`` ×
    the period of run time each period, the kernel's period of 100 ms, as a container's CPU limit.
    Entered, the process joins it, not capped; left, the process goes back to the root group (if
    it still runs) and the cgroup is removed.

    ``unavailable()`` says why no such cgroup can be made here (``None``: it can)."""

    def __init__(self, name: str, pid: int):
        self.path = os.path.join(CPU_CGROUPS, f"{name}-{os.getpid()}")
        self.pid = pid

    @staticmethod
    def unavailable() -> str | None:
        probe = os.path.join(CPU_CGROUPS, f"polygate-probe-{os.getpid()}")
        try:
            os.mkdir(probe)
            os.rmdir(probe)
        except OSError as e:
            return f"no cgroup v1 cpu controller to write at {CPU_CGROUPS} ({e.strerror})"
        return None

    def _write(self, path: str, value: object) -> None:
        with open(path, "w") as f:
            f.write(str(value))

    def __enter__(self) -> CpuCap:
        os.mkdir(self.path)
        try:
            self._write(os.path.join(self.path, "cgroup.procs"), self.pid)  # every thread of the process
        except OSError:
            os.rmdir(self.path)
            raise
        return self

    def limit(self, cores: float | None) -> None:
        """Cap the process to ``cores`` cores from now on (``None``: no cap)."""
        with open(os.path.join(self.path, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        self._write(os.path.join(self.path, "cpu.cfs_quota_us"), -1 if cores is None else round(cores * period))

    def throttling(self) -> tuple[int, int]:
        """(periods, periods in which the cap stopped the process) so far: from ``cpu.stat``."""
        with open(os.path.join(self.path, "cpu.stat")) as f:
            stat = dict(line.split() for line in f)
        return int(stat["nr_periods"]), int(stat["nr_throttled"])

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(ProcessLookupError):  # a process that ended has left the cgroup already
            self._write(os.path.join(CPU_CGROUPS, "cgroup.procs"), self.pid)
        os.rmdir(self.path)


def best_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """The figures of several rounds of one thing, each key at its best: the least of a CPU
    figure (a key ending ``_cpu_us_per_record``), the most of any other (a rate)."""
    return {k: (min if k.endswith("_cpu_us_per_record") else max)(r[k] for r in runs) for k in runs[0]}


def us_per(seconds: float, count: int) -> float:
    """``seconds`` spread over ``count`` things, in µs each (3 decimals)."""
    return round(seconds / count * 1e6, 3)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator`` (3 decimals), or ``None`` when either is missing or the denominator
    is 0 (a server CPU time under /proc's 10 ms tick)."""
    return None if numerator is None or not denominator else round(numerator / denominator, 3)


def comparison(label: str, reference: str, records_s: tuple[float, float],
               server_cpu_us: tuple[float | None, float | None], cpu_note: str | None = None) -> dict:
    """One polygate-against-reference entry of a result's ``comparisons`` (what summary.py plots).

    ``records_s`` and ``server_cpu_us`` (the server process's CPU µs per record) are
    (polygate, reference) pairs; a CPU figure is ``None`` where there is no server process to
    meter (a reference run in-process, or published figures), and ``cpu_note`` then says why."""
    if None in server_cpu_us and not cpu_note:
        raise ValueError(f"{label}: a missing server CPU figure needs a note")
    entry = {"label": label, "reference": reference,
             "polygate_records_s": round(records_s[0]), "reference_records_s": round(records_s[1]),
             "ratio_records_s": ratio(*records_s),
             "polygate_server_cpu_us_per_record": server_cpu_us[0],
             "reference_server_cpu_us_per_record": server_cpu_us[1],
             "ratio_server_cpu": ratio(*server_cpu_us)}
    return {**entry, "server_cpu_note": cpu_note} if cpu_note else entry


def cpu_text(us: float | None) -> str:
    """A server CPU figure as printed: ``1.23 µs/rec``, or ``n/a`` where there is no server process."""
    return "n/a" if us is None else f"{us:.2f} µs/rec"


def ratio_text(value: float | None) -> str:
    """A ratio as printed: ``x1.23``, or ``x?`` where it is undefined (see ``ratio``)."""
    return "x?" if value is None else f"x{value:.2f}"
