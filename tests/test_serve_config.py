"""``gateway serve``: options checked at start in one line; a config file and the environment;
what the log says (and in which form)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from gateway.clients.v1 import V1Client
from gateway.launcher import GATEWAY, GatewayProcess, default_stop_signals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "polygate.example.toml")


def refused(tmp_path, *args: str, env: dict | None = None) -> str:
    run = subprocess.run([GATEWAY, "serve", "--admin", "none", "--data-dir", str(tmp_path / "d"), *args], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, **(env or {})))
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    return lines[0]


@pytest.mark.parametrize(("args", "expected"), [
    (("--log-level", "LOUD"), "'--log-level': 'LOUD' is not one of"),
    (("--max-frame", "v1=abc"), "--max-frame v1='abc': expected a positive number of bytes"),
    (("--max-frame", "kafka=100", "--protocols", "v1"), "codec kafka: --max-frame given for a codec that is not served"),
    (("--default-partitions", "0"), "'--default-partitions': 0 is not in the range x>=1"),
    (("--replication-factor", "0"), "'--replication-factor'"),
    (("--protocols", "v1", "--listen", "kafka=127.0.0.1:0"), "codec kafka: --listen given for a codec that is not served"),
    (("--listen", "v1"), "--listen: expected CODEC=VALUE"),
    (("--fsync", "sometimes"), "--fsync: fsync policy must be"),
    (("--bogus",), "No such option '--bogus'"),
    (("--log-file", "/nonexistent/dir/log"), "--log-file"),
])
def test_a_bad_option_stops_the_start_in_one_line(tmp_path, args, expected):
    assert expected in refused(tmp_path, *args)


def test_an_empty_data_dir_is_refused_not_replaced_by_the_home_folder(tmp_path):
    run = subprocess.run([GATEWAY, "serve", "--admin", "none", "--data-dir", ""], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.strip() == "polygate: --data-dir is empty (leave it out for the default)"


def test_listen_without_protocols_serves_only_the_listed_codecs(tmp_path):
    proc = subprocess.Popen([GATEWAY, "serve", "--admin", "none", "--data-dir", str(tmp_path / "d"), "--listen", "tank=127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_stop_signals)
    try:
        lines = []
        while not any("polygate: tank listening" in line for line in lines):
            lines.append(proc.stdout.readline())
            assert lines[-1], lines
    finally:
        proc.terminate()
        rest, _ = proc.communicate(timeout=20)
    banner = [line for line in lines + rest.splitlines() if " listening on " in line]
    assert len(banner) == 1 and banner[0].startswith("polygate: tank listening"), banner


def partitions_of_a_new_topic(gw) -> int:
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.produce("fresh", "k", "v")
        return c.list_topics()["fresh"]


def test_the_command_line_wins_over_the_environment_which_wins_over_the_file(tmp_path):
    config = tmp_path / "polygate.toml"
    config.write_text('default-partitions = 2\nlog_level = "WARNING"\n')
    cases = [((), {}, 2), ((), {"POLYGATE_DEFAULT_PARTITIONS": "4"}, 4),
             (("--default-partitions", "5"), {"POLYGATE_DEFAULT_PARTITIONS": "4"}, 5)]
    for i, (args, env, expected) in enumerate(cases):
        gw = GatewayProcess(str(tmp_path / f"d{i}"), ("v1",), ("--config", str(config), *args), env=env).start()
        try:
            assert partitions_of_a_new_topic(gw) == expected, (args, env)
            assert " INFO " not in gw.log  # the file's log level applied
        finally:
            gw.stop()


def test_a_config_file_with_an_unknown_key_is_refused(tmp_path):
    config = tmp_path / "polygate.toml"
    config.write_text("data-dirr = '/tmp/x'\n")
    line = refused(tmp_path, "--config", str(config))
    assert f"--config {config}: unknown option 'data-dirr'" in line and "data-dir" in line


def test_the_example_file_names_every_option_and_its_defaults_start_a_gateway(tmp_path):
    from gateway.cli.serve import serve

    with open(EXAMPLE, encoding="utf-8") as f:
        text = f.read()
    keys = set(re.findall(r"^# ([a-z-]+) = ", text, re.M))
    assert keys == {p.name.replace("_", "-") for p in serve.params if p.name != "config"}
    enabled = [line[2:] for line in text.splitlines()
               if re.match(r"^# [a-z-]+ = ", line) and not line.endswith('= ""') and "= []" not in line]
    config = tmp_path / "polygate.toml"
    config.write_text("\n".join(enabled) + '\nprotocols = "v1"\n')
    gw = GatewayProcess(str(tmp_path / "d"), ("v1",), ("--config", str(config))).start()
    try:
        with V1Client("127.0.0.1", gw.port("v1")) as c:
            assert c.list_topics() == {}
    finally:
        gw.stop()


def test_the_log_says_what_happened_in_json(tmp_path):
    log_file = tmp_path / "gateway.log"
    gw = GatewayProcess(str(tmp_path / "d"), ("v1",), ("--log-format", "json", "--log-file", str(log_file),
                                                       "--log-level", "DEBUG")).start()
    try:
        with V1Client("127.0.0.1", gw.port("v1")) as c:
            c.create_topic("orders", 2)
            assert c.request("JOIN", "billing", "orders", "m1").ok
        with V1Client("127.0.0.1", gw.port("v1")) as c:
            c.delete_topic("orders")
        time.sleep(0.5)
    finally:
        gw.stop()
    entries = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    messages = [e["message"] for e in entries]
    text = "\n".join(messages)
    assert re.search(r"^v1: connection from 127\.0\.0\.1:\d+ accepted$", text, re.M)
    assert re.search(r"^v1: connection from 127\.0\.0\.1:\d+ closed$", text, re.M)
    assert "topic orders: created with 2 partitions" in text and "topic orders: deleted" in text
    assert re.search(r"group billing: generation \d+ \(server member m1\S* joined\)", text), text
    assert re.search(r"v1 127\.0\.0\.1:\d+: User:ANONYMOUS runs .*CreateTopic", text)  # DEBUG: the requests
    assert "Starting factory" not in text and "IPv4Address" not in text


def tls_listeners(gw: GatewayProcess) -> list[str]:
    """The codecs whose start banner says they speak TLS."""
    return [line.split()[1] for line in gw.output if " listening on " in line and "(TLS);" in line]


def test_tls_has_one_name_on_the_command_line_in_the_file_and_in_the_environment(tmp_path):
    """``--tls``, ``tls = "all"`` (as packaging/polygate.toml writes it) and ``POLYGATE_TLS=all`` all
    put the listeners behind TLS (the file's key used to be ``tls-codecs``, and the variable was ignored)."""
    from tls_support import Pki

    cert, key = Pki(tmp_path / "pki").issue("server")
    files = ("--tls-cert", str(cert), "--tls-key", str(key))
    config = tmp_path / "polygate.toml"
    config.write_text('tls = "all"\n')
    cases = {"flag": (("--tls", "all", *files), {}), "file": (("--config", str(config), *files), {}),
             "environment": (files, {"POLYGATE_TLS": "all"})}
    for how, (args, env) in cases.items():
        gw = GatewayProcess(str(tmp_path / how), ("v1",), args, env=env).start()
        try:
            assert tls_listeners(gw) == ["v1"], (how, gw.log)
        finally:
            gw.stop()


def test_an_environment_variable_that_names_no_option_is_warned_about(tmp_path):
    gw = GatewayProcess(str(tmp_path / "d"), ("v1",), env={"POLYGATE_TLS_CODECS": "all", "POLYGATE_PASSWORD": "x"})
    gw.start()
    try:
        with V1Client("127.0.0.1", gw.port("v1")) as c:
            assert c.list_topics() == {}
        assert "environment variable POLYGATE_TLS_CODECS names no option" in gw.log
        assert "POLYGATE_PASSWORD names" not in gw.log  # the clients' password: known, not an option
    finally:
        gw.stop()
