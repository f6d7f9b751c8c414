"""Pipelined V1 PRODUCE throughput, beside a bare Twisted line-echo server.

Both servers get the same request lines over the same loopback connections
from the same load generator, in one run: the echo server is the ceiling of
a Twisted line protocol on this machine, so the gateway/echo ratio is the
figure to quote (absolute numbers on a 2-core machine are noisy), beside each
server's CPU time per request (from /proc), which the clients sharing the
cores do not blur.

    python benchmarks/v1_produce.py [--requests N] [--window W]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Gateway, comparison, cpu_seconds, progress, write_result  # noqa: E402

ECHO_SERVER = r"""
import sys
from twisted.internet import reactor, protocol
from twisted.protocols.basic import LineReceiver

class Echo(LineReceiver):
    delimiter = b"\n"
    MAX_LENGTH = 65536
    def lineReceived(self, line):
        self.sendLine(line)

f = protocol.Factory.forProtocol(Echo)
port = reactor.listenTCP(0, f, interface="127.0.0.1")
print(port.getHost().port, flush=True)
reactor.run()
"""


def drive(port: int, connections: int, requests: int, window: int) -> float:
    """Send ``requests`` pipelined PRODUCE lines over ``connections``; returns requests/s."""
    per_conn = requests // connections
    value = "x" * 100
    errors: list[BaseException] = []

    def run(conn_id: int) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            lines = [f"V1|{conn_id}-{i}|PRODUCE|bench k{i % 97}:{value}\n".encode() for i in range(window)]
            block = b"".join(lines)
            sent = received = 0
            while received < per_conn:
                while sent < per_conn and sent - received < 2 * window:
                    n = min(window, per_conn - sent)
                    s.sendall(block if n == window else b"".join(lines[:n]))
                    sent += n
                data = s.recv(1 << 20)
                if not data:
                    raise ConnectionError("server closed")
                received += data.count(b"\n")
            s.close()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(connections)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return per_conn * connections / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    echo = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    echo_port = int(echo.stdout.readline())
    results, comparisons = {}, []
    try:
        with Gateway(["v1"]) as gw:
            servers = (("echo", echo_port, echo.pid), ("gateway", gw.ports["v1"], gw.proc.pid))
            for connections in (1, 8):
                best = {"echo": 0.0, "gateway": 0.0}
                cpu = {"echo": float("inf"), "gateway": float("inf")}  # server CPU µs per request
                for r in range(args.rounds):  # alternate servers so drift hits both alike
                    for name, port, pid in servers:
                        before = cpu_seconds(pid)
                        rate = drive(port, connections, args.requests, args.window)
                        used = (cpu_seconds(pid) - before) / args.requests * 1e6
                        best[name], cpu[name] = max(best[name], rate), min(cpu[name], used)
                        progress(f"{connections} conn, round {r + 1}: {name:8} {rate:10,.0f} req/s, "
                                 f"server CPU {used:5.1f} µs/req")
                ratio = best["gateway"] / best["echo"]
                results[f"{connections}_connections"] = {
                    "gateway_req_per_s": round(best["gateway"]), "echo_req_per_s": round(best["echo"]),
                    "ratio_gateway_to_echo": round(ratio, 3), "gateway_cpu_us_per_req": round(cpu["gateway"], 2),
                    "echo_cpu_us_per_req": round(cpu["echo"], 2)}
                comparisons.append(comparison(f"PRODUCE, {connections} connection(s)", "Twisted line-echo server",
                                              (best["gateway"], best["echo"]),
                                              (round(cpu["gateway"], 2), round(cpu["echo"], 2))))
                print(f"{connections} connection(s): gateway {best['gateway']:,.0f} req/s, "
                      f"echo {best['echo']:,.0f} req/s, ratio {ratio:.2f}; server CPU per request: "
                      f"gateway {cpu['gateway']:.1f} µs, echo {cpu['echo']:.1f} µs")
    finally:
        echo.terminate()
        echo.wait()
    path = write_result("v1_produce", {"requests": args.requests, "window": args.window, "results": results,
                                       "comparisons": comparisons})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
