"""Fixtures and helpers shared by the Kafka tests.

``kafka_gateway`` is a real ``gateway serve`` with the Kafka and V1
listeners. The external clients the tests drive are installed here when
missing (never skipped): kcat from Debian, kafkajs (and its pure-JS snappy codec) from npm into
``tests/.kafkajs``, @platformatic/kafka (a client of Kafka 3.5+ API versions only) into
``tests/.platformatic`` (both git-ignored; ``npm_install`` installs other npm packages the same way). An install that fails fails the test with
the installer's output.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

HERE = Path(__file__).parent
KAFKAJS_DIR = HERE / ".kafkajs"
KAFKAJS_PACKAGES = ("kafkajs@2.2.4", "kafkajs-snappy@1.1.0")  # snappy codec in pure JS (lz4/zstd need native code)
PLATFORMATIC_DIR = HERE / ".platformatic"
PLATFORMATIC_PACKAGES = ("@platformatic/kafka@1.35.0",)  # the last line that runs on Node 20


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def gateway_in_mode(request, gateway_factory, test_cluster, protocols, args=()):
    """A gateway on local storage (``request.param == "local"``) or in cluster mode over a cluster
    of its own (``"cluster"``: a polygate on local storage, which has every feature of Kafka's that
    the test needs; Tansu 0.6 lacks some). Skipped when the
    whole run is in cluster mode (``POLYGATE_TEST_STORAGE``): the test brings its own cluster."""
    from gateway.launcher import GatewayProcess

    if test_cluster is not None:
        pytest.skip("brings its own cluster")
    if request.param == "cluster":
        cluster = GatewayProcess(None, ("kafka",)).start()
        request.addfinalizer(cluster.stop)
        args = (*args, "--storage", f"kafka://{cluster.address('kafka')}")
    return gateway_factory(protocols, args)


def create_topics(server: str, *topics: str, partitions: int | None = None, conf: dict | None = None) -> None:
    """Create ``topics`` at the Kafka listener ``server`` (``host:port``) by CreateTopics, with
    ``partitions`` each (None: the gateway's ``--default-partitions``), as the admin client of the
    librdkafka settings ``conf`` (a login, TLS): the gateway's Metadata never creates a topic, so a
    Kafka client's topics are made first, as on a Kafka with ``auto.create.topics.enable=false``."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": server, **(conf or {})})
    created = admin.create_topics([NewTopic(t, -1 if partitions is None else partitions) for t in topics])
    for future in created.values():
        future.result(30)


def wait_until(check: Callable[[], object], timeout: float = 30.0, interval: float = 0.1, what: str = "") -> object:
    """Poll ``check`` until it returns a true value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what or check}")
        time.sleep(interval)


def _run(args: list[str], what: str, **kw) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        pytest.fail(f"installing {what} failed ({' '.join(args)}):\n{proc.stdout}\n{proc.stderr}")


@contextmanager
def installing() -> Iterator[None]:
    """Hold the machine-wide lock of the tests' installs (apt-get, npm, pip) while checking for and
    installing a tool: test workers run side by side (pytest-xdist), each with its own session
    fixtures; one installs while the others wait, then find the tool installed."""
    with open(os.path.join(tempfile.gettempdir(), "polygate-tests-install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def kcat() -> str:
    """Path of Debian's kcat, installed with apt-get if missing."""
    with installing():
        path = shutil.which("kcat")
        if path is None:
            _run(["apt-get", "update", "-q"], "kcat (apt-get update)")
            _run(["apt-get", "install", "-y", "-q", "kcat"], "kcat",
                 env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
            path = shutil.which("kcat")
    if path is None:
        pytest.fail("kcat is not on PATH after apt-get install kcat")
    return path


def npm_install(directory: Path, packages: tuple[str, ...], what: str) -> Path:
    """``directory``, whose node_modules holds ``packages`` (npm install on first use)."""
    with installing():
        if not all((directory / "node_modules" / p.rpartition("@")[0] / "package.json").exists() for p in packages):
            directory.mkdir(exist_ok=True)
            _run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(directory), *packages], what)
    return directory


@pytest.fixture(scope="session")
def kafkajs() -> Path:
    """Directory whose node_modules holds kafkajs (npm install on first use)."""
    return npm_install(KAFKAJS_DIR, KAFKAJS_PACKAGES, "kafkajs")


@pytest.fixture(scope="session")
def platformatic() -> Path:
    """Directory whose node_modules holds @platformatic/kafka (npm install on first use)."""
    return npm_install(PLATFORMATIC_DIR, PLATFORMATIC_PACKAGES, "@platformatic/kafka")


def run_node(modules_dir: Path, script: str, config: dict, timeout: float = 120) -> dict:
    """Run a Node script (``tests/<script>``) with ``config`` as JSON in argv and the packages of
    ``modules_dir`` on NODE_PATH; returns its JSON output."""
    proc = subprocess.run(["node", str(HERE / script), json.dumps(config)], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, NODE_PATH=str(modules_dir / "node_modules"),
                                                               KAFKAJS_NO_PARTITIONER_WARNING="1"))
    if proc.returncode != 0:
        pytest.fail(f"node {script} failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def kafka_gateway(gateway_factory):
    """A gateway serving Kafka (and V1, for cross-protocol checks); new groups wait 300 ms for members."""
    return gateway_factory(("kafka", "v1"), ("--default-partitions", "1",
                                             "--codec-option", "kafka.group.initial.rebalance.delay.ms=300"))


def bootstrap(gw) -> str:
    return gw.address("kafka")


def consume(consumer, count: int, timeout: float = 20) -> list:
    """``count`` records from a confluent-kafka ``consumer`` (polled until ``timeout``); fails on an error."""
    out: list = []

    def more() -> bool:
        msg = consumer.poll(0.2)
        if msg is not None:
            assert msg.error() is None, msg.error()
            out.append(msg)
        return len(out) >= count

    wait_until(more, timeout, 0, f"{count} records")
    return out
