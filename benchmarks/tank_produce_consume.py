"""TANK produce and consume through ``tank-cli``: the gateway and, in the same run, the real TANK broker.

With ``--tank-cli PATH`` (the C++ client of phaistos-networks/TANK) and
``--reference HOST:PORT`` (a TANK broker running on this machine: how to build
both is in docs/conformance.md), the same tank-cli commands drive the gateway
and the reference, one after the other, alternating for ``--rounds`` rounds
(each on a fresh one-partition topic), so that load from elsewhere on the
shared machine hits both alike:

* ``produce -s 1000 -f FILE``: ``--messages`` lines of 100 B, 1000 to a bundle,
  one bundle a request;
* ``produce -s 1 -f FILE``: ``--single`` lines, one message a request;
* ``get -S -d beginning``: each of those topics read back from the first
  message (every message counted, so a lost one fails the run).

The produce commands also drive a third server, the *floor*: a bare Twisted
server that splits tank-cli's produce requests, writes each bundle to a file
with one ``pwritev`` and acknowledges it, and does nothing else (no
validation, no index, no topic): less than any broker does for each request,
as the line echo is for V1 (``v1_produce.py``). polygate/floor says what
polygate's work and layers cost, and floor/TANK what is left for them under a
goal set against TANK.

For each it prints the messages/s and the CPU time the broker's process spent
per message (user + system, from /proc: tank-cli shares the 2 cores, so the
rates are blurred and the CPU per message is what each broker itself costs),
round by round, then the best of each with the spread (least-most) over the
rounds, and the gateway/reference ratios. The reference's process is
``--reference-pid``, or the one listening on the reference's port (found
through /proc/net/tcp and /proc/*/fd).

Without ``--tank-cli`` and ``--reference`` the comparison is skipped (said so,
and no comparison is written): the gateway alone is then driven by
``produce`` and ``consume`` below (pipelined requests of 1, 100 and 1000
messages built before the clock starts; ``benchmarks/cluster.py`` uses them
too).

    python benchmarks/tank_produce_consume.py [--tank-cli PATH --reference HOST:PORT [--reference-pid PID]]
        [--messages N] [--single N] [--rounds R]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import socket
import string
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    Gateway,
    Meter,
    best_of,
    comparison,
    progress,
    ratio,
    ratio_text,
    us_per,
    write_result,
)

from gateway.clients.tank import TankClient, consume_request, produce_request  # noqa: E402
from gateway.codecs.tank.format import encode, read_varint  # noqa: E402

SIZE = 100
FETCH_SIZE = 4 << 20
ACK = 10  # 01 | u32 len | u32 request id | u8 error, for a one-partition produce
REFERENCE = "TANK 4.0 C++ broker (same machine, same run)"
FLOOR = "a bare Twisted server that writes and acks (same run)"
FLOOR_SERVER = r"""
import os, struct, sys, tempfile
from twisted.internet import protocol, reactor

log = tempfile.TemporaryFile(dir=sys.argv[1])
written = 0

class Floor(protocol.Protocol):
    # tank-cli's produce: u8 1 | u32 size | u16 client version | u32 request id | ... ; the answer
    # for its one partition: u8 1 | u32 5 | u32 request id | u8 0 (no error).
    pending = b""

    def dataReceived(self, data):
        global written
        buf = self.pending + data if self.pending else data
        at = 0
        while len(buf) - at >= 5:
            end = at + 5 + struct.unpack_from("<I", buf, at + 1)[0]
            if len(buf) < end:
                break
            written += os.pwritev(log.fileno(), [memoryview(buf)[at + 11:end]], written)
            self.transport.write(b"\x01\x05\x00\x00\x00" + buf[at + 7:at + 11] + b"\x00")
            at = end
        self.pending = buf[at:]

port = reactor.listenTCP(0, protocol.Factory.forProtocol(Floor), interface="127.0.0.1")
print(port.getHost().port, flush=True)
reactor.run()
"""
# the tank-cli cases: name -> (bundle size of the produce, or None for the consume of that produce's topic)
CASES = ("produce 1000/request", "produce 1/request", "consume 1000-message bundles", "consume 1-message bundles")
STATS = re.compile(rb"^>> ([\d,]+) messages$", re.MULTILINE)  # `get -S`: one line per response


def values(seed: int) -> list[bytes]:
    """997 distinct random alphanumeric values of ``SIZE`` bytes (cycled through by every driver)."""
    rng = random.Random(seed)
    return ["".join(rng.choices(string.ascii_letters + string.digits, k=SIZE)).encode() for _ in range(997)]


def produce(port: int, topic: str, per_request: int, total: int) -> float:
    """Seconds to produce ``total`` messages in pipelined requests of ``per_request``; checks every ack."""
    pool = values(per_request)
    requests = total // per_request
    ts = int(time.time() * 1000)
    bundles = [encode([(ts, None, pool[(i * per_request + j) % 997]) for j in range(per_request)])
               for i in range(min(requests, 64))]
    frames = [produce_request(i + 1, [(topic, 0, bundles[i % len(bundles)])]) for i in range(requests)]
    writes = [b"".join(frames[i : i + 256]) for i in range(0, len(frames), 256)]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.recv(5, socket.MSG_WAITALL)  # the greeting ping
    failures = []

    def read_acks() -> None:
        buf = bytearray(requests * ACK)
        view = memoryview(buf)
        got = 0
        while got < len(buf):
            n = sock.recv_into(view[got:])
            if not n:
                failures.append("connection closed")
                return
            got += n
        if any(buf[ACK - 1 :: ACK]) or buf[::ACK] != b"\x01" * requests:
            failures.append("an acknowledgement carried an error")

    reader = threading.Thread(target=read_acks)
    start = time.perf_counter()
    reader.start()
    for w in writes:
        sock.sendall(w)
    reader.join()
    elapsed = time.perf_counter() - start
    sock.close()
    if failures:
        raise RuntimeError(failures[0])
    return elapsed


def consume(port: int, topic: str, total: int) -> float:
    """Seconds to consume ``total`` messages from the first one, one fetch at a time."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.recv(5, socket.MSG_WAITALL)
    seq = 1
    count = 0
    start = time.perf_counter()
    rid = 0
    while count < total:
        rid += 1
        sock.sendall(consume_request(rid, [(topic, 0, seq)], fetch_size=FETCH_SIZE))
        msg_id, size = struct.unpack("<BI", sock.recv(5, socket.MSG_WAITALL))
        payload = sock.recv(size, socket.MSG_WAITALL)
        (header_len,) = struct.unpack_from("<I", payload)
        first_seq, _, chunk_len = struct.unpack_from("<QQI", payload, header_len - 20 + 4)
        chunk = memoryview(payload)[4 + header_len :]
        pos = 0
        next_seq = first_seq
        while pos < chunk_len:  # bundle headers only: varint length, flags, [varint count]
            n, body = read_varint(chunk, pos, chunk_len)
            if body + n > chunk_len:
                break  # the last bundle, cut by the fetch size
            messages = (chunk[body] >> 2) & 0x0F or read_varint(chunk, body + 1, body + n)[0]
            count += messages
            next_seq += messages
            pos = body + n
        if next_seq == seq:
            raise RuntimeError(f"no progress at {seq}")
        seq = next_seq
    elapsed = time.perf_counter() - start
    sock.close()
    return elapsed


def listener_pid(port: int) -> int:
    """The process listening on TCP ``port`` (any address): the inode of its listening socket from
    /proc/net/tcp and tcp6, then the process holding that socket among /proc/*/fd."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()  # sl local_address rem_address st ... inode
                if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        # a process that ends meanwhile, or one of another user, is not it
        with contextlib.suppress(OSError):
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                return int(pid)
    raise SystemExit(f"no process of this machine listens on port {port}: give --reference-pid")


@contextlib.contextmanager
def message_file(count: int, seed: int) -> Iterator[str]:
    """A temporary file of ``count`` lines of ``SIZE`` bytes, for ``tank-cli produce -f``."""
    pool = values(seed)
    with tempfile.NamedTemporaryFile("wb", prefix="tank-bench-", suffix=".txt") as f:
        for start in range(0, count, 997):
            f.write(b"".join(v + b"\n" for v in pool[: min(997, count - start)]))
        f.flush()
        yield f.name


@contextlib.contextmanager
def floor_server() -> Iterator[tuple[int, int]]:
    """``FLOOR_SERVER`` in a process of its own, writing into a temporary directory: its port and pid."""
    with tempfile.TemporaryDirectory(prefix="tank-floor-") as where:
        floor = subprocess.Popen([sys.executable, "-c", FLOOR_SERVER, where], stdout=subprocess.PIPE, text=True)
        try:
            yield int(floor.stdout.readline()), floor.pid
        finally:
            floor.terminate()
            floor.wait()


class TankCli:
    """``tank-cli`` against one broker (``HOST:PORT``) whose process is ``pid``: each command timed and metered."""

    def __init__(self, cli: str, broker: str, pid: int, produce_only: bool = False):
        self.cli, self.broker, self.pid, self.produce_only = cli, broker, pid, produce_only

    def run(self, topic: str, *command: str) -> tuple[bytes, Meter]:
        with Meter(server=self.pid) as meter:
            done = subprocess.run([self.cli, "-b", self.broker, "-t", topic, "-p", "0", *command],
                                  capture_output=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"tank-cli {' '.join(command)} on {self.broker}: exit {done.returncode}, "
                               f"{(done.stdout + done.stderr).decode(errors='replace').strip()[-500:]}")
        return done.stdout, meter

    def round(self, tag: str, files: dict[int, tuple[str, int]]) -> dict[str, float]:
        """One round of every case (the produce cases alone for a ``produce_only`` server, which
        has no topics) on fresh topics named after ``tag``: ``<case>_msgs_s`` and
        ``<case>_server_cpu_us_per_record`` for each case."""
        figures: dict[str, float] = {}
        for bundle, (path, count) in files.items():
            topic = f"bm{bundle}_{tag}"
            cases = [(f"produce {bundle}/request", ("produce", "-s", str(bundle), "-f", path))]
            if not self.produce_only:
                self.run(topic, "create_topic", "1")
                cases.append((f"consume {bundle}-message bundles", ("get", "-S", "-d", "beginning")))
            for case, command in cases:
                out, meter = self.run(topic, *command)
                if case.startswith("consume"):
                    got = sum(int(n.replace(b",", b"")) for n in STATS.findall(out))
                    if got != count:
                        raise RuntimeError(f"{self.broker}: {got} of {count} messages read back from {topic}")
                figures[f"{case}_msgs_s"] = round(count / meter.seconds)
                figures[f"{case}_server_cpu_us_per_record"] = us_per(meter.used["server"], count)
        return figures


def against_reference(args: argparse.Namespace) -> None:
    """Every tank-cli case on the gateway and on the reference, alternating for ``args.rounds`` rounds."""
    host, _, port = args.reference.rpartition(":")
    ref_pid = args.reference_pid or listener_pid(int(port))
    counts = {1000: args.messages, 1: args.single}
    with (Gateway(["tank"]) as gw, floor_server() as (floor_port, floor_pid),
          contextlib.ExitStack() as files_stack):
        files = {bundle: (files_stack.enter_context(message_file(n, bundle)), n) for bundle, n in counts.items()}
        brokers = {"polygate": TankCli(args.tank_cli, f"127.0.0.1:{gw.ports['tank']}", gw.proc.pid),
                   "tank": TankCli(args.tank_cli, args.reference, ref_pid),
                   "floor": TankCli(args.tank_cli, f"127.0.0.1:{floor_port}", floor_pid, produce_only=True)}
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in brokers}
        tag = time.strftime("%H%M%S")
        for r in range(args.rounds):
            turn = r % len(brokers)
            for name in list(brokers)[turn:] + list(brokers)[:turn]:  # turns: none always first
                rounds[name].append(brokers[name].round(f"{tag}_{r}", files))
                progress(f"round {r + 1}, {name}: " + ", ".join(
                    f"{case} {rounds[name][-1][f'{case}_msgs_s']:,} msg/s "
                    f"({rounds[name][-1][f'{case}_server_cpu_us_per_record']:.3f} µs)"
                    for case in CASES if f"{case}_msgs_s" in rounds[name][-1]))
    results = {name: best_of(rs) for name, rs in rounds.items()}

    def ratios_of(a: str, b: str) -> tuple[dict[str, float | None], dict[str, list[float | None]]]:
        """``a``/``b`` of the best figures, and round by round (the servers of one round ran back to
        back: the spread), for the cases both ran."""
        keys = [k for k in results[a] if k in results[b]]
        return ({k: ratio(results[a][k], results[b][k]) for k in keys},
                {k: [ratio(x[k], y[k]) for x, y in zip(rounds[a], rounds[b], strict=True)] for k in keys})

    ratios, per_round = ratios_of("polygate", "tank")
    floor_ratios = {"polygate/floor": ratios_of("polygate", "floor")[0], "floor/tank": ratios_of("floor", "tank")[0]}

    def spread(name: str, key: str) -> str:
        figures = [r[key] for r in rounds[name]]
        return f"{min(figures):,}-{max(figures):,}"

    print(f"\ntank-cli, {args.messages:,} (1000/request) and {args.single:,} (1/request) messages of {SIZE} B, "
          f"{args.rounds} rounds; best (spread over the rounds)")
    for case in CASES:
        rate, cpu = f"{case}_msgs_s", f"{case}_server_cpu_us_per_record"
        print(f"{case:<29} " + "   ".join(
            f"{name} {results[name][rate]:>10,.0f} msg/s ({spread(name, rate)}), "
            f"{results[name][cpu]:.3f} µs/msg ({spread(name, cpu)})" for name in rounds if rate in results[name]))
        print(f"{'':<29} polygate/TANK: msg/s {ratio_text(ratios[rate])} (rounds {per_round[rate]}), "
              f"server CPU per message {ratio_text(ratios[cpu])} (rounds {per_round[cpu]})")
        for name, these in floor_ratios.items():
            if rate in these:
                print(f"{'':<29} {name}: msg/s {ratio_text(these[rate])}, server CPU per message "
                      f"{ratio_text(these[cpu])}")

    def compared(case: str, name: str, reference: str) -> dict:
        return comparison(case, reference, (results["polygate"][f"{case}_msgs_s"], results[name][f"{case}_msgs_s"]),
                          (results["polygate"][f"{case}_server_cpu_us_per_record"],
                           results[name][f"{case}_server_cpu_us_per_record"]))

    comparisons = [compared(case, "tank", REFERENCE) for case in CASES]
    comparisons += [compared(case, "floor", FLOOR) for case in CASES if f"{case}_msgs_s" in results["floor"]]
    path = write_result("tank_produce_consume", {
        "driver": "tank-cli", "messages": counts, "message_bytes": SIZE, "reference": args.reference,
        "rounds": rounds, "results": results, "ratios": ratios, "ratios_by_round": per_round,
        "floor_ratios": floor_ratios, "comparisons": comparisons})
    progress(f"wrote {path}")


def gateway_alone(args: argparse.Namespace) -> None:
    """The gateway alone, driven in-process with requests of 1, 100 and 1000 messages (no reference)."""
    n = args.messages
    results = {}
    with Gateway(["tank"]) as gw:
        port = gw.ports["tank"]
        for per_request in (1, 100, 1000):
            topic = f"bm{per_request}"
            with TankClient("127.0.0.1", port) as c:
                c.create_topic(topic, 1)
            progress(f"producing {n} x {SIZE} B in requests of {per_request}")
            with Meter(server=gw.proc.pid) as p_cpu:
                p = produce(port, topic, per_request, n)
            with TankClient("127.0.0.1", port) as c:
                assert c.discover_partitions(topic) == [(1, n)], "not every message landed"
            progress(f"consuming {topic}")
            with Meter(server=gw.proc.pid) as q_cpu:
                q = consume(port, topic, n)
            results[per_request] = {
                "produce_msgs_per_s": n / p, "produce_server_cpu_us_per_record": us_per(p_cpu.used["server"], n),
                "consume_msgs_per_s": n / q, "consume_server_cpu_us_per_record": us_per(q_cpu.used["server"], n),
            }
    print(f"\n{n:,} messages of {SIZE} B, the gateway alone")
    print(f"{'per request':>11} {'produce msg/s':>14} {'gw µs/msg':>10} {'consume msg/s':>14} {'gw µs/msg':>10}")
    for per_request, r in results.items():
        print(f"{per_request:>11} {r['produce_msgs_per_s']:>14,.0f} {r['produce_server_cpu_us_per_record']:>10.3f} "
              f"{r['consume_msgs_per_s']:>14,.0f} {r['consume_server_cpu_us_per_record']:>10.3f}")
    path = write_result("tank_produce_consume", {
        "driver": "in-process", "messages": n, "message_bytes": SIZE, "reference": None,
        "results": {str(k): v for k, v in results.items()}, "comparisons": []})
    progress(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tank-cli", help="the tank-cli binary (built as docs/conformance.md says)")
    parser.add_argument("--reference", metavar="HOST:PORT", help="a running TANK broker to compare with")
    parser.add_argument("--reference-pid", type=int,
                        help="the reference broker's process (default: the one listening on its port)")
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages of the batched cases")
    parser.add_argument("--single", type=int, default=100_000, help="messages of the one-per-request cases")
    parser.add_argument("--rounds", type=int, default=3, help="alternate the brokers this many times")
    args = parser.parse_args()
    if args.tank_cli and args.reference:
        against_reference(args)
    else:
        progress("comparison with the real TANK broker skipped: it needs --tank-cli PATH and --reference HOST:PORT "
                 "(see docs/conformance.md); measuring the gateway alone")
        gateway_alone(args)


if __name__ == "__main__":
    main()
