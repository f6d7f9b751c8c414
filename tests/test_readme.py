"""The README's commands run as written: the "Using it" section (its consume shows what its produce
wrote), the Security example (users, ACLs, a login) and the Spark snippet.

Every command of the "Using it" ``sh`` blocks runs here, in the order written, with one change: the
ports. ``gateway serve`` gets a free port in each ``--listen CODEC=HOST:PORT`` (and no admin listener,
whose default port another gateway may hold), and each client command gets ``--server`` with the
port of its protocol's listener (the README relies on the default ports). Comments are dropped
as the shell drops them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.launcher import BANNER, GATEWAY, default_stop_signals, free_port

README = Path(__file__).resolve().parent.parent / "README.md"


def using_it() -> list[list[str]]:
    """The commands of the "Using it" section: up to the table of ``gateway serve`` options."""
    text = README.read_text()
    start = text.index("\n## Using it\n")
    section = text[start:text.index("`gateway serve` options", start)]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [shlex.split(line, comments=True) for block in blocks for line in block.splitlines() if line.strip()]


def protocol_of(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg in ("--protocol", "-p") and i + 1 < len(argv):
            return argv[i + 1]
    return "kafka" if argv[1] == "groups" else "v1"  # the commands' defaults


def test_the_readme_using_it_section_runs_as_written(tmp_path):
    commands = using_it()
    assert all(c[0] == "gateway" for c in commands), commands
    serves = [c for c in commands if c[1] == "serve"]
    assert len(serves) == 1 and commands[0] is serves[0]
    serve = serves[0][1:]
    ports = {}
    for i, arg in enumerate(serve):
        if arg == "--listen":
            codec, _, address = serve[i + 1].partition("=")
            ports[codec] = free_port()
            serve[i + 1] = f"{codec}={address.rpartition(':')[0]}:{ports[codec]}"
    assert set(ports) >= {"v1", "kafka"}
    help_text = subprocess.run([GATEWAY, "serve", "--help"], capture_output=True, text=True, check=True).stdout
    if "--admin" in help_text:
        serve += ["--admin", "none"]
    proc = subprocess.Popen([GATEWAY, *serve], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                            preexec_fn=default_stop_signals)
    log = []
    try:
        listening = set()
        deadline = time.monotonic() + 30
        while listening != set(ports):
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "gateway serve did not start:\n" + "".join(log)
            log.append(line)
            match = BANNER.match(line.strip())
            if match:
                assert int(match.group(3)) == ports[match.group(1)]
                listening.add(match.group(1))
        assert (tmp_path / "data").is_dir()  # --data-dir ./data, from where the commands run
        out = {}
        for argv in commands[1:]:
            protocol = protocol_of(argv)
            done = subprocess.run([GATEWAY, *argv[1:], "--server", f"127.0.0.1:{ports[protocol]}"], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0 and done.stderr == "", (argv, done.stderr)
            out[shlex.join(argv)] = done.stdout
    finally:
        proc.terminate()
        rest, _ = proc.communicate(timeout=30)
        log.append(rest)
    assert proc.returncode == 0 and "Traceback" not in "".join(log), "".join(log)

    assert out["gateway topics create orders --partitions 3"] == "orders\t3\n"
    # V1 places both on partition 2 (FNV-1a 32 of user1), and consume reads every partition: it shows them
    assert out["gateway produce orders created paid --key user1"] == "orders\t2\t0\tuser1\norders\t2\t1\tuser1\n"
    assert out["gateway consume orders"] == "2\t0\t-\tcreated\n2\t1\t-\tpaid\n"
    records = [json.loads(line) for line in out["gateway consume orders --protocol kafka --output json"].splitlines()]
    assert [(r["partition"], r["offset"], r["key"], r["value"]) for r in records] == [
        (2, 0, "user1", "created"), (2, 1, "user1", "paid")]
    topic, partition, offset, key = out["gateway produce orders 'two words' --key a:b -p kafka"].split("\t")
    assert (topic, key) == ("orders", "a:b\n")
    grouped = out["gateway consume orders --group billing -p kafka"].splitlines()
    assert sorted(grouped) == sorted([f"{partition}\t{offset}\ta:b\ttwo words", "2\t0\tuser1\tcreated",
                                      "2\t1\tuser1\tpaid"])
    described = out["gateway groups describe billing"].splitlines()
    assert described[:2] == ["GROUP\tSTATE\tASSIGNOR\tMEMBERS", "billing\tEmpty\trange\t0"]
    assert "orders\t2\t-\t-\t2\t2\t0" in described  # committed up to the high watermark: no lag
    assert out["gateway topics describe orders"].splitlines()[0] == "PARTITION\tLOG_START\tHIGH_WATERMARK\tRECORDS"
    status = dict(line.split("\t") for line in out["gateway status --protocol kafka"].splitlines())
    assert (status["topics"], status["partitions"], status["records"], status["groups"]) == ("1", "3", "3", "1")
    assert out["gateway topics delete orders"] == "deleted orders\n"


def section_blocks(title: str, language: str = "sh") -> list[str]:
    """The ``language`` code blocks of the README section ``## title``."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(rf"```{language}\n(.*?)```", text[start:end if end > 0 else None], re.S)


def shell(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """``script`` run by bash (stopping at the first failure) in ``cwd``, with this venv's ``gateway`` first
    on the PATH, as a reader who activated it."""
    env = dict(os.environ, PATH=f"{os.path.dirname(GATEWAY)}:{os.environ['PATH']}")
    env.pop("POLYGATE_PASSWORD", None)
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_readme_security_example_runs_as_written(tmp_path):
    """Users and ACLs as the Security section shows them: the users file, a gateway that requires
    logins with ACLs on, then an admin adding alice and her ACLs, and alice producing and consuming."""
    setup, commands = section_blocks("Security")[:2]
    *prepare, serve_line = [line for line in setup.splitlines() if line.strip()]
    done = shell("\n".join(prepare), tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "users.txt").stat().st_mode & 0o077 == 0  # readable by its owner only
    port = free_port()
    serve = [arg.replace("127.0.0.1:9092", f"127.0.0.1:{port}") for arg in shlex.split(serve_line)]
    assert serve[:2] == ["gateway", "serve"]
    proc = subprocess.Popen([GATEWAY, *serve[1:], "--admin", "none"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                            preexec_fn=default_stop_signals)
    log = []
    try:
        deadline = time.monotonic() + 30
        while True:
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "gateway serve did not start:\n" + "".join(log)
            log.append(line)
            if BANNER.match(line.strip()):
                break
        done = shell(commands.replace("127.0.0.1:9092", f"127.0.0.1:{port}"), tmp_path)
    finally:
        proc.terminate()
        rest, _ = proc.communicate(timeout=30)
        log.append(rest)
    assert done.returncode == 0, (done.stdout, done.stderr, "".join(log))
    out = done.stdout
    assert "user alice: SCRAM-SHA-256, SCRAM-SHA-512 set" in out
    assert "alice" in out and "admin" in out  # users list
    assert "orders-eu\t" in out and "\thello" in out  # alice's produce, then her consume as group billing
    password = (tmp_path / "users.txt").read_text().split(":", 1)[1].strip()
    assert password not in "".join(log) and (tmp_path / "alice.pw").read_text().strip() not in "".join(log)


@pytest.mark.spark  # a JVM of its own: it runs with the Spark tests, one test at a time
def test_the_readme_spark_example_runs_as_written(tmp_path):
    """The Security section's Python block (Spark reading a topic) against a gateway holding records."""
    from gateway.clients.v1 import V1Client
    from gateway.launcher import GatewayProcess

    (code,) = section_blocks("Security", "python")
    gw = GatewayProcess(str(tmp_path / "data"), ("v1", "kafka"), ("--admin", "none")).start()
    try:
        with V1Client("127.0.0.1", gw.port("v1")) as v1:
            v1.create_topic("orders", 2)
            for i in range(7):
                v1.produce("orders", f"user{i}", f"order {i}".replace(" ", "-"))
        script = code.replace("127.0.0.1:9092", gw.address("kafka")) + "\nprint('rows', df.count())\n"
        done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env={k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"})
    finally:
        gw.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows 7" in done.stdout.splitlines()
