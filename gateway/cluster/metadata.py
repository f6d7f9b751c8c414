"""The cluster's topics and watermarks, kept at hand for the broker's synchronous calls,
and whether the cluster answers at all.

A thread asks the cluster every ``interval`` seconds (sooner when woken)
for its topics, their ids and every partition's first and next offsets, and
hands the answer to the reactor thread. The first question is asked before the
listeners open, so a gateway whose cluster is up serves from its first request.

The reactor probes the cluster every ``PROBE_EVERY_S`` with a Metadata
request of no topic, through the gateway's own client
(``gateway.cluster.wire``, on a connection of its own), that must be
answered within ``PROBE_TIMEOUT_S``: that is what ``reachable`` (and so
``/readyz``) follows, so a stalled, silent or dead cluster is seen within
about ``PROBE_EVERY_S + PROBE_TIMEOUT_S`` and a cluster back within about a
probe. The probe thus takes the data path's own way to the cluster (its
connections, TLS and SASL), not librdkafka's, and needs no thread. While the
cluster is unreachable, calls that need it fail with ``STORAGE_ERROR`` saying
so. Each change is logged once: ``cluster unavailable: why``, ``cluster
available again``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, OffsetSpec
from twisted.internet import defer, task
from twisted.python import failure

from gateway import model as m
from gateway.cluster.bridge import Loop
from gateway.cluster.config import ClusterConfig
from gateway.cluster.wire import METADATA, ClusterClient
from gateway.codec import topic_configs
from gateway.model import CommandError, ErrorCode

log = logging.getLogger(__name__)

TOPIC_SET = (ConfigSource.DYNAMIC_TOPIC_CONFIG, ConfigSource.DYNAMIC_TOPIC_CONFIG.value)  # as enum or as number
FIRST_ASK_S = 5.0  # how long a start waits for the cluster before it serves anyway (and fails calls)
PROBE_EVERY_S = 0.25  # a probe starts this long after the previous one started (at once after a failed one)
PROBE_TIMEOUT_S = 1.0  # a probe not answered within this long: the cluster is unreachable
MISS_REFRESH_S = 0.1  # a lookup of a topic not known asks the cluster again, at most this often
# How long a stop waits for the thread: it only reads, and may be blocked in a request to a cluster
# that does not answer for as long as the request timeout (10 s by default).
STOP_WAIT_S = 0.5


@attrs.define
class PartitionMarks:
    """What the gateway knows of a partition's offsets; ``high_watermark`` only grows
    between deletions (every source that moves it reports a value it has seen)."""

    log_start_offset: int = 0
    high_watermark: int = 0


@attrs.define
class TopicState:
    topic_id: str
    partitions: list[PartitionMarks]
    config: m.TopicConfig = m.TopicConfig()  # the settings the cluster reports as set for the topic


class Metadata:
    """Topics, ids and watermarks of the cluster (read in the reactor thread only)."""

    def __init__(self, config: ClusterConfig, admin: AdminClient, client: ClusterClient, reactor: Any,
                 interval: float = 1.0, gone: Callable[[str], None] = lambda topic: None):
        self.config = config
        self.client = client
        self.gone = gone  # called with a topic the cluster no longer has
        self.admin = admin
        self.reactor = reactor
        self.interval = interval
        self.topics: dict[str, TopicState] = {}
        self.reachable = False  # the last probe was answered, and the topics were read at least once
        self.error = "not asked yet"  # why not reachable
        self.brokers = 0
        self._answering = False  # the last probe's outcome
        self._pictured = False  # the topics were read at least once
        self._said_unavailable = False  # "cluster unavailable" logged since the cluster last answered
        self._ids: dict[str, str] = {}  # thread-side: topic -> id, asked once per name
        self._configs: dict[str, m.TopicConfig] = {}  # thread-side: topic -> its settings, asked with its id
        self._wake = threading.Event()
        self._refreshed: list[Any] = []  # reactor-side callbacks waiting for the next refresh
        self._loop = Loop("polygate-cluster-metadata", self._step)
        self._probe = task.LoopingCall(self._send_probe)
        self._probe.clock = reactor
        self._probing: defer.Deferred | None = None  # the probe waiting for its answer
        self._asked_on_miss = 0.0

    def start(self) -> None:
        """Ask once now (in the calling thread, before anything is served), then keep asking
        and probing."""
        timeout = min(self.config.request_timeout_ms / 1000, FIRST_ASK_S)
        try:
            topics, brokers = self._ask(timeout)
        except Exception as e:  # noqa: BLE001 - not reachable yet: the threads go on asking
            self._answered(None, why(e, timeout))
        else:
            self._answered(brokers, "")
            self._apply(topics, brokers, "")
        self._loop.start()
        self._probe.start(PROBE_EVERY_S, now=False)

    def stop(self) -> None:
        """Stop probing and asking. The thread is not waited for past ``STOP_WAIT_S``: it holds
        nothing to deliver, and one blocked in a request to a cluster that is down would hold a
        gateway's stop for the request timeout (a daemon, it ends with its request or the process)."""
        self._loop.stopping.set()
        if self._probe.running:
            self._probe.stop()
        self._wake.set()
        self._loop.stop(STOP_WAIT_S)

    def refresh(self, then: Any = None) -> None:
        """Ask again now; ``then()`` runs in the reactor thread after the next answer (or failure)."""
        if then is not None:
            self._refreshed.append(then)
        self._wake.set()

    # ------------------------------------------------------------------ reactor side

    def state(self, topic: str) -> TopicState:
        """The topic's state; raises ``UNKNOWN_TOPIC`` and asks the cluster again soon
        (another gateway may have just created it; a client's retry then finds it)."""
        self.check_reachable()
        state = self.topics.get(topic)
        if state is None:
            now = time.monotonic()
            if now - self._asked_on_miss > MISS_REFRESH_S:
                self._asked_on_miss = now
                self.refresh()
            raise CommandError(ErrorCode.UNKNOWN_TOPIC, f"unknown topic {topic!r}")
        return state

    def marks(self, topic: str, partition: int) -> PartitionMarks:
        state = self.state(topic)
        if not 0 <= partition < len(state.partitions):
            raise CommandError(ErrorCode.UNKNOWN_PARTITION, f"{topic!r} has no partition {partition}")
        return state.partitions[partition]

    def seen(self, topic: str, partition: int) -> PartitionMarks:
        """The partition's marks as last seen, even while the cluster is unreachable: the answer to
        a produce the cluster has just confirmed carries them, and must not fail because a probe
        of the cluster went unanswered meanwhile. Else as ``marks``."""
        state = self.topics.get(topic)
        if state is not None and 0 <= partition < len(state.partitions):
            return state.partitions[partition]
        return self.marks(topic, partition)

    def check_reachable(self) -> None:
        if not self.reachable:
            raise CommandError(ErrorCode.STORAGE_ERROR,
                               f"the Kafka cluster at {self.config.bootstrap} is unavailable: {self.error}")

    def advance(self, topic: str, partition: int, high_watermark: int, log_start_offset: int | None = None) -> bool:
        """Record a watermark seen elsewhere (a delivery, a fetch): whether it moved."""
        state = self.topics.get(topic)
        if state is None or partition >= len(state.partitions):
            return False
        marks = state.partitions[partition]
        moved = False
        if high_watermark > marks.high_watermark:
            marks.high_watermark = high_watermark
            moved = True
        if log_start_offset is not None and log_start_offset > marks.log_start_offset:
            marks.log_start_offset = log_start_offset
        return moved

    def _answered(self, brokers: int | None, error: str) -> None:
        """A probe's outcome: the cluster's broker count, or ``None`` and why it did not answer."""
        if brokers is None:
            self._answering, self.error = False, error
            if not self._said_unavailable:
                log.warning("cluster unavailable: the Kafka cluster at %s: %s", self.config.bootstrap, error)
                self._said_unavailable = True
        else:
            if not self._answering:
                self.refresh()  # what changed while it did not answer (a restarted cluster may have lost topics)
            self._answering, self.brokers = True, brokers
        self._update()

    def _update(self) -> None:
        was, self.reachable = self.reachable, self._answering and self._pictured
        if self.reachable and not was:
            self.error = ""
            again = self._said_unavailable
            self._said_unavailable = False
            log.info("cluster available%s: the Kafka cluster at %s (%d brokers, %d topics)",
                     " again" if again else "", self.config.bootstrap, self.brokers, len(self.topics))

    def _apply(self, topics: dict[str, tuple[str, list[tuple[int, int]], m.TopicConfig]] | None, brokers: int,
               error: str) -> None:
        if topics is None:
            log.debug("cluster metadata not refreshed: %s", error)  # reachability is the probe's to say
            if not self._pictured:
                self.error = error
        else:
            self.brokers = brokers
            for name in list(self.topics):
                if name not in topics or self.topics[name].topic_id != topics[name][0]:
                    del self.topics[name]  # deleted (and maybe created again): its old marks are void
                    self.gone(name)
            for name, (topic_id, marks, config) in topics.items():
                state = self.topics.get(name)
                if state is None:
                    state = self.topics[name] = TopicState(topic_id, [], config)
                for p, (start, end) in enumerate(marks):
                    if p < len(state.partitions):
                        current = state.partitions[p]
                        current.log_start_offset = max(current.log_start_offset, start)
                        current.high_watermark = max(current.high_watermark, end)
                    else:
                        state.partitions.append(PartitionMarks(start, end))
            if not self._pictured:
                self._pictured = True
                self._update()
        waiting, self._refreshed = self._refreshed, []
        for then in waiting:
            try:
                then()
            except Exception:  # noqa: BLE001 - one waiter's bug must not strand the others
                log.exception("after a metadata refresh")

    # ------------------------------------------------------------------ thread side

    def _step(self) -> None:
        try:
            topics, brokers = self._ask()
        except Exception as e:  # noqa: BLE001 - not refreshed this time: the probe says whether it is reachable
            self.reactor.callFromThread(self._apply, None, 0, why(e, self.config.request_timeout_ms / 1000))
        else:
            self.reactor.callFromThread(self._apply, topics, brokers, "")
        self.admin.poll(0)  # the admin client's log lines (``clientlog``) are handed over here
        self._wake.wait(self.interval)
        self._wake.clear()

    def _send_probe(self) -> None:
        """Ask the cluster for its brokers (no topic); no answer within ``PROBE_TIMEOUT_S`` is an
        unreachable cluster (its connection is closed: the next probe opens a new one)."""
        if self._probing is not None:
            return
        probe = self.client.request(-1, "probe", METADATA, {"Topics": [], "AllowAutoTopicCreation": False},
                                    PROBE_TIMEOUT_S)
        self._probing = probe

        def unanswered() -> None:
            self._answered(None, f"no answer within {PROBE_TIMEOUT_S:g} s")
            self.client.abandon("probe")

        late = self.reactor.callLater(PROBE_TIMEOUT_S, unanswered)

        def done(result: Any) -> None:
            self._probing = None
            if late.active():
                late.cancel()
            if isinstance(result, failure.Failure):
                self._answered(None, result.getErrorMessage())
            else:
                self._answered(len(result.Brokers), "")

        probe.addBoth(done)

    def _ask(self, timeout: float | None = None) -> tuple[dict[str, tuple[str, list[tuple[int, int]], m.TopicConfig]], int]:
        timeout = timeout or self.config.request_timeout_ms / 1000
        cluster = self.admin.list_topics(timeout=timeout)
        names = {name: len(t.partitions) for name, t in cluster.topics.items()
                 if t.error is None and not name.startswith("__")}
        new = [n for n in names if n not in self._ids]
        if new:
            described = self.admin.describe_topics(TopicCollection(new), request_timeout=timeout)
            for name, future in described.items():
                try:
                    self._ids[name] = str(future.result(timeout).topic_id)
                except Exception:  # noqa: BLE001 - no id (an old cluster): the name stands for it
                    self._ids[name] = name
            self._configs.update(self._topic_configs(new, timeout))
        for name in list(self._ids):
            if name not in names:
                del self._ids[name]
                self._configs.pop(name, None)
        marks: dict[str, list[tuple[int, int]]] = {n: [(0, 0)] * count for n, count in names.items()}
        if names:
            tps = [TopicPartition(n, p) for n, count in names.items() for p in range(count)]
            earliest = self.admin.list_offsets({tp: OffsetSpec.earliest() for tp in tps}, request_timeout=timeout)
            latest = self.admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, request_timeout=timeout)
            for tp in tps:
                try:
                    start = earliest[tp].result(timeout).offset
                    end = latest[tp].result(timeout).offset
                except Exception:  # noqa: BLE001 - a partition without a leader now: known next time
                    continue
                marks[tp.topic][tp.partition] = (max(start, 0), max(end, 0))
        return ({n: (self._ids.get(n, n), marks[n], self._configs.get(n, m.TopicConfig())) for n in names},
                len(cluster.brokers))

    def _topic_configs(self, names: list[str], timeout: float) -> dict[str, m.TopicConfig]:
        """The retention and segment settings the cluster reports as set (not defaulted) for ``names``."""
        resources = [ConfigResource(ConfigResource.Type.TOPIC, n) for n in names]
        out = {}
        for resource, future in self.admin.describe_configs(resources, request_timeout=timeout).items():
            try:
                entries = future.result(timeout)
            except Exception:  # noqa: BLE001 - not described now: reported as defaults
                continue
            set_here = {k: e.value for k, e in entries.items() if not e.is_default and e.value not in (None, "")
                        and (k in topic_configs.SETTINGS or e.source in TOPIC_SET)}
            try:
                out[resource.name] = topic_configs.apply(m.TopicConfig(), set_here)
            except CommandError as e:  # a value polygate does not take: reported as defaults
                log.warning("topic %s: settings not read: %s", resource.name, e)
        return out

    def set_config(self, topic: str, config: m.TopicConfig) -> None:
        """``topic``'s settings after this gateway changed them in the cluster (reactor thread; the
        thread side keeps them too, for a topic it has to describe again)."""
        self._configs[topic] = config
        state = self.topics.get(topic)
        if state is not None:
            state.config = config


def why(error: Exception, timeout: float) -> str:
    """What a request to the cluster that failed (after ``timeout`` seconds at most) says, for a log
    line or a client."""
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        if error.args[0].code() == KafkaError._TIMED_OUT:
            return f"no answer within {timeout:g} s"
        return error.args[0].str()
    return str(error)
