"""What docs/operations.md tells operators to install: the systemd unit and its config file,
and the refusal line it quotes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIT = os.path.join(ROOT, "packaging", "polygate.service")
CONFIG = os.path.join(ROOT, "packaging", "polygate.toml")
DOC = os.path.join(ROOT, "docs", "operations.md")
GATEWAY = os.path.join(os.path.dirname(sys.executable), "gateway")


def unit() -> dict[str, dict[str, list[str]]]:
    """The unit file as section -> key -> values (a key may be given several times)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    with open(UNIT) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                current = sections.setdefault(line.strip("[]"), {})
                continue
            key, _, value = line.partition("=")
            current.setdefault(key, []).append(value)
    return sections


def test_the_unit_runs_the_shipped_config_as_its_own_user_in_a_sandbox():
    service = unit()["Service"]
    one = {k: v[-1] for k, v in service.items()}
    assert one["ExecStart"] == "/opt/polygate/bin/gateway serve --config /etc/polygate/polygate.toml"
    assert one["User"] == one["Group"] == "polygate"
    with open(CONFIG, "rb") as f:
        config = tomllib.load(f)
    assert config["data-dir"] == f"/var/lib/{one['StateDirectory']}"
    assert one["StateDirectoryMode"] == "0700" and one["UMask"] == "0077"
    for key, value in {"NoNewPrivileges": "yes", "CapabilityBoundingSet": "", "ProtectSystem": "strict",
                       "ProtectHome": "yes", "PrivateTmp": "yes", "PrivateDevices": "yes",
                       "RestrictSUIDSGID": "yes", "SystemCallArchitectures": "native",
                       "RestartPreventExitStatus": "2", "KillSignal": "SIGTERM"}.items():
        assert one[key] == value, key
    assert service["SystemCallFilter"] == ["@system-service", "~@privileged"]
    assert int(one["LimitNOFILE"]) >= 65536


def test_systemd_accepts_the_unit_and_rates_its_exposure_low():
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    verify = subprocess.run(["systemd-analyze", "verify", UNIT], capture_output=True, text=True, timeout=60)
    complaints = [line for line in (verify.stdout + verify.stderr).splitlines()
                  if line.strip() and "/opt/polygate/bin/gateway is not executable" not in line]
    assert not complaints, complaints
    security = subprocess.run(["systemd-analyze", "security", "--offline=yes", UNIT], capture_output=True,
                              text=True, timeout=60)
    found = re.search(r"Overall exposure level for polygate.service: ([0-9.]+)", security.stdout)
    if found is None:
        pytest.skip(f"this systemd-analyze rates no unit file offline: {security.stderr.strip()[:200]}")
    assert float(found.group(1)) <= 2.0, security.stdout[-2000:]


def test_the_shipped_config_starts_a_gateway(gateway_factory, tmp_path):
    """The file's options are all ``gateway serve`` options; the command line overrides it."""
    gw = gateway_factory(("v1",), ("--config", CONFIG, "--admin", "none"), data_dir=tmp_path / "data")
    assert any("v1 listening on 127.0.0.1:" in line for line in gw.output)


def test_the_refusal_quoted_by_the_doc_is_the_gateways(tmp_path):
    data = tmp_path / "polygate"
    data.mkdir(mode=0o700)
    (data / "FORMAT").write_text("3\n")
    run = subprocess.run([GATEWAY, "serve", "--data-dir", str(data), "--protocols", "v1", "--listen",
                          "v1=127.0.0.1:0", "--admin", "none"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    said = run.stderr.strip().splitlines()[-1].replace(str(data), "/var/lib/polygate")
    with open(DOC) as f:
        assert f"\n{said}\n" in f.read()
