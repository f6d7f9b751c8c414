"""The cluster's topics and watermarks, kept at hand for the broker's synchronous calls,
and whether the cluster answers at all.

Every ``interval`` seconds (sooner when asked to) the reactor asks the cluster,
through the gateway's own client (``gateway.cluster.wire``, on connections
of its own), for its topics with their ids and leaders (Metadata), every
partition's first and next offsets (ListOffsets, earliest and latest, one
request each per partition leader) and a new topic's settings
(DescribeConfigs). The brokers and leaders of each answer are the client's
too: the data path and the broker's calls see one picture of the cluster.
The first question is asked before the listeners open (``start``), so a
gateway whose cluster is up serves from its first request.

The reactor also probes the cluster every ``PROBE_EVERY_S`` with a Metadata
request of no topic (on a connection of its own) that must be answered
within ``PROBE_TIMEOUT_S``: that is what ``reachable`` (and so ``/readyz``)
follows, so a stalled, silent or dead cluster is seen within about
``PROBE_EVERY_S + PROBE_TIMEOUT_S`` and a cluster back within about a probe.
While the cluster is unreachable, calls that need it fail with
``STORAGE_ERROR`` saying so. Each change is logged once: ``cluster
unavailable: why``, ``cluster available again``. None of this needs a thread.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
from twisted.internet import defer, task
from twisted.python import failure

from gateway import model as m
from gateway.cluster.config import ClusterConfig
from gateway.cluster.wire import (
    DESCRIBE_CONFIGS,
    LIST_OFFSETS,
    METADATA,
    STALE_METADATA,
    ClusterClient,
    WireError,
    at_leader,
)
from gateway.cluster.writer import command_error
from gateway.codec import topic_configs
from gateway.codecs.kafka.errors import Errors
from gateway.model import CommandError, ErrorCode

log = logging.getLogger(__name__)

FIRST_ASK_S = 5.0  # how long a start waits for the cluster before it serves anyway (and fails calls)
# A probe starts this long after the previous one started: a cluster that stops answering is seen
# within PROBE_EVERY_S + PROBE_TIMEOUT_S (1.5 s, within /readyz's 2 s), and an idle gateway makes
# two small requests a second.
PROBE_EVERY_S = 0.5
PROBE_TIMEOUT_S = 1.0  # a probe not answered within this long: the cluster is unreachable
MISS_REFRESH_S = 0.1  # a lookup of a topic not known asks the cluster again, at most this often
LANE = "topics"  # the client's connections for the asks (closed when an ask is not answered in time)
# ListOffsets' timestamps of a partition's first and next offset, and of its record of the latest time
EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
TOPIC_RESOURCE = 2  # DescribeConfigs' resource type of a topic
TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5  # DescribeConfigs' sources of a value: set for the topic, Kafka's default

Marks = list[tuple[int, int]]  # a topic's partitions' (first offset, next offset), by partition
Topics = dict[str, tuple[str, Marks, m.TopicConfig]]  # name -> (id, marks, settings)


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
    """Topics, ids and watermarks of the cluster (read and asked in the reactor thread)."""

    def __init__(self, config: ClusterConfig, client: ClusterClient, reactor: Any,
                 interval: float = 1.0, gone: Callable[[str], None] = lambda topic: None):
        self.config = config
        self.client = client
        self.gone = gone  # called with a topic the cluster no longer has
        self.reactor = reactor
        self.interval = interval
        self.topics: dict[str, TopicState] = {}
        self.reachable = False  # the last probe was answered, and the topics were read at least once
        self.error = "not asked yet"  # why not reachable
        self.brokers = 0
        self._answering = False  # the last probe's outcome
        self._pictured = False  # the topics were read at least once
        self._said_unavailable = False  # "cluster unavailable" logged since the cluster last answered
        self._ids: dict[str, str] = {}  # topic -> the id its settings were asked with
        self._configs: dict[str, m.TopicConfig] = {}  # topic -> its settings, asked once per id
        self._refreshed: list[Any] = []  # callbacks waiting for the next ask's outcome
        self._running = False
        self._asking: object | None = None  # the ask waiting for its answer
        self._wanted = False  # asked to ask again (``refresh``) since the last ask started
        self._late: Any = None  # the timer that ends an ask not answered in time
        self._next: Any = None  # the timer of the next ask
        self._probe = task.LoopingCall(self._send_probe)
        self._probe.clock = reactor
        self._probing: defer.Deferred | None = None  # the probe waiting for its answer
        self._asked_on_miss = 0.0

    def start(self) -> defer.Deferred:
        """Ask now, then keep asking and probing. Fires once the first ask has its outcome, within
        ``FIRST_ASK_S`` at most: a cluster that did not answer by then leaves the gateway serving
        and failing the calls that need it until it answers."""
        self._running = True
        first = self._ask(min(self.config.request_timeout_ms / 1000, FIRST_ASK_S), first=True)

        def probe(_: Any) -> None:
            if self._running:
                self._probe.start(PROBE_EVERY_S, now=False)

        return first.addCallback(probe)

    def stop(self) -> None:
        """Stop probing and asking; an ask under way is left unanswered."""
        self._running = False
        self._asking = None
        for timer in (self._late, self._next):
            if timer is not None and timer.active():
                timer.cancel()
        if self._probe.running:
            self._probe.stop()

    def refresh(self, then: Any = None) -> None:
        """Ask again now (once the ask under way, if any, is over); ``then()`` runs in the reactor
        thread after the outcome of an ask begun after this call (an answer or a failure)."""
        if then is not None:
            self._refreshed.append(then)
        self._wanted = True
        if self._running and self._asking is None:
            self._ask_soon(0)

    # ------------------------------------------------------------------ what the broker reads

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

    def set_config(self, topic: str, config: m.TopicConfig) -> None:
        """``topic``'s settings after this gateway changed them in the cluster (kept for a topic
        whose state is made again, until the topic has another id)."""
        self._configs[topic] = config
        state = self.topics.get(topic)
        if state is not None:
            state.config = config

    # ------------------------------------------------------------------ reachability

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

    # ------------------------------------------------------------------ the asks

    def _ask_soon(self, delay: float) -> None:
        if self._next is not None and self._next.active():
            self._next.cancel()
        self._next = self.reactor.callLater(delay, self._ask, self.config.request_timeout_ms / 1000)

    def _ask(self, timeout: float, first: bool = False) -> defer.Deferred:
        """Ask the cluster for its picture, within ``timeout``; the Deferred fires once its outcome
        is applied (an ask not answered in time fails, and its connections are closed)."""
        self._wanted = False
        waiting, self._refreshed = self._refreshed, []
        ask = self._asking = object()
        over: defer.Deferred = defer.Deferred()

        def settle(topics: Topics | None, brokers: int, error: str) -> None:
            if self._asking is not ask:
                return  # late (or stopped): the outcome was settled already
            self._asking = None
            if self._late.active():
                self._late.cancel()
            if first and topics is None:  # a start's ask says whether the cluster answers, as a probe
                self._answered(None, error)
            else:
                if first:
                    self._answered(brokers, "")
                self._apply(topics, brokers, error)
            for then in waiting:
                try:
                    then()
                except Exception:  # noqa: BLE001 - one waiter's bug must not strand the others
                    log.exception("after a metadata refresh")
            if self._running:
                self._ask_soon(0 if self._wanted else self.interval)
            over.callback(None)

        def late() -> None:
            settle(None, 0, f"no answer within {timeout:g} s")
            self.client.abandon(LANE)

        self._late = self.reactor.callLater(timeout, late)
        self._read(timeout).addCallbacks(lambda picture: settle(picture[0], picture[1], ""),
                                         lambda f: settle(None, 0, why(f.value, timeout)))
        return over

    @defer.inlineCallbacks
    def _read(self, timeout: float) -> Any:
        """The cluster's topics and its broker count."""
        answer = yield self.client.request(-1, LANE, METADATA, {"Topics": None, "AllowAutoTopicCreation": False},
                                           timeout)
        self.client.learn(answer, complete=True)
        listed = {t.Name: t for t in answer.Topics if not t.ErrorCode and not t.Name.startswith("__")}
        ids = {name: _topic_id(t) for name, t in listed.items()}
        for name in [n for n in self._ids if n not in listed]:
            del self._ids[name]
            self._configs.pop(name, None)
        new = [n for n in listed if self._ids.get(n) != ids[n]]  # new, or made again under another id
        marks: dict[str, Marks] = {n: [(0, 0)] * len(t.Partitions) for n, t in listed.items()}
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for name, t in listed.items():
            for p in t.Partitions:
                if not p.ErrorCode and p.LeaderId >= 0 and p.PartitionIndex < len(t.Partitions):
                    by_leader.setdefault(p.LeaderId, []).append((name, p.PartitionIndex))
        asks = [self._offsets(leader, partitions, timeout, marks) for leader, partitions in by_leader.items()]
        if new:
            asks.append(self._describe(new, timeout))
        yield defer.gatherResults(asks)
        for name in new:
            self._ids[name] = ids[name]
        return {n: (ids[n], marks[n], self._configs.get(n, m.TopicConfig())) for n in listed}, len(answer.Brokers)

    def _offsets(self, leader: int, partitions: list[tuple[str, int]], timeout: float,
                 marks: dict[str, Marks]) -> defer.Deferred:
        """``partitions``' first and next offsets, from their ``leader``, into ``marks``; a partition
        not answered for both keeps (0, 0), and is known next time."""
        topics: dict[str, list[int]] = {}
        for name, p in partitions:
            topics.setdefault(name, []).append(p)

        def ask(timestamp: int) -> defer.Deferred:
            return self.client.request(leader, LANE, LIST_OFFSETS, list_offsets_body(topics, timestamp),
                                       timeout).addCallbacks(_offsets_of, lambda f: {})

        def combine(answers: list[dict[tuple[str, int], int]]) -> None:
            earliest, latest = answers
            for key, start in earliest.items():
                end = latest.get(key)
                if end is not None and key[1] < len(marks[key[0]]):
                    marks[key[0]][key[1]] = (max(start, 0), max(end, 0))

        return defer.gatherResults([ask(EARLIEST), ask(LATEST)]).addCallback(combine)

    def list_offset(self, topic: str, partition: int, timestamp: int,
                    read_committed: bool = False) -> defer.Deferred:
        """*May wait.* The partition's ``(offset, timestamp)`` for ``timestamp`` (``LATEST``,
        ``MAX_TIMESTAMP``, or a time in ms: the first offset at or after it, -1 if none) as its
        leader answers a ListOffsets, at read_committed if asked; fails with the client's
        ``CommandError``. The one way the gateway asks the cluster for one partition's offset."""
        doing = f"list offsets of {topic}/{partition}"
        body = list_offsets_body({topic: [partition]}, timestamp, read_committed)

        def read(answer: Any) -> tuple[int, int]:
            for t in answer.Topics:
                for p in t.Partitions:
                    if p.ErrorCode:
                        if p.ErrorCode in STALE_METADATA:
                            self.client.stale(topic, partition)
                        raise WireError(p.ErrorCode, doing, sent=True)
                    return p.Offset, p.get("Timestamp", -1)
            raise WireError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"{doing}: the answer names no partition", sent=True)

        def failed(f: Any) -> Any:
            f.trap(WireError)
            raise command_error(f.value, doing)

        timeout = self.config.request_timeout_ms / 1000
        return at_leader(self.client, topic, partition, lambda leader: self.client.request(
            leader.node_id, LANE, LIST_OFFSETS, body, timeout)).addCallback(read).addErrback(failed)

    def _describe(self, names: list[str], timeout: float) -> defer.Deferred:
        """The retention and segment settings the cluster reports as set (not defaulted) for
        ``names``, into ``_configs``; a topic not described is reported with the defaults."""
        for name in names:
            self._configs.pop(name, None)
        body = {"Resources": [{"ResourceType": TOPIC_RESOURCE, "ResourceName": n, "ConfigurationKeys": None}
                              for n in names]}

        def described(answer: Any) -> None:
            for result in answer.Results:
                if result.ErrorCode:
                    continue  # not described now: reported as defaults
                try:
                    self._configs[result.ResourceName] = topic_configs.apply(m.TopicConfig(), _set_here(result.Configs))
                except CommandError as e:  # a value polygate does not take: reported as defaults
                    log.warning("topic %s: settings not read: %s", result.ResourceName, e)

        return self.client.request(-1, LANE, DESCRIBE_CONFIGS, body, timeout).addCallbacks(
            described, lambda f: log.debug("topic settings not read: %s", f.getErrorMessage()))

    def _apply(self, topics: Topics | None, brokers: int, error: str) -> None:
        if topics is None:
            log.debug("cluster metadata not refreshed: %s", error)  # reachability is the probe's to say
            if not self._pictured:
                self.error = error
            return
        self.brokers = brokers
        for name in list(self.topics):
            known = topics.get(name)
            # Deleted, or deleted and made again (another id; fewer partitions, for a cluster that
            # gives no ids, as a topic never loses partitions): its old marks are void.
            if known is None or self.topics[name].topic_id != known[0] or len(known[1]) < len(self.topics[name].partitions):
                del self.topics[name]
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


def _topic_id(topic: Any) -> str:
    """A Metadata answer's topic id as Kafka writes it (unpadded base64url); the name for a cluster
    that gives none (Metadata before version 10)."""
    raw = topic.get("TopicId")
    return topic.Name if raw is None else base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def list_offsets_body(topics: Mapping[str, Iterable[int]], timestamp: int,
                      read_committed: bool = False) -> dict[str, Any]:
    """A ListOffsets request's body: ``timestamp`` (``EARLIEST``, ``LATEST``, ``MAX_TIMESTAMP`` or a
    time in ms) for each partition of ``topics`` (name -> partitions)."""
    return {"ReplicaId": -1, "IsolationLevel": int(read_committed), "Topics": [
        {"Name": name, "Partitions": [{"PartitionIndex": p, "Timestamp": timestamp} for p in partitions]}
        for name, partitions in topics.items()]}


def _offsets_of(answer: Any) -> dict[tuple[str, int], int]:
    """The offsets a ListOffsets answer gives, by partition (those answered with an error left out)."""
    return {(t.Name, p.PartitionIndex): p.Offset for t in answer.Topics for p in t.Partitions if not p.ErrorCode}


def _set_here(configs: Any) -> dict[str, str]:
    """The settings a DescribeConfigs answer reports as set (not Kafka's defaults): polygate's own, and
    any other set for the topic itself."""
    out = {}
    for c in configs:
        source = c.get("ConfigSource", 0)  # version 0 says IsDefault instead
        default = c.IsDefault if "IsDefault" in c else source == DEFAULT_CONFIG
        if not default and c.Value not in (None, "") and (c.Name in topic_configs.SETTINGS or source == TOPIC_CONFIG):
            out[c.Name] = c.Value
    return out


def why(error: Exception, timeout: float) -> str:
    """What a request to the cluster that failed (after ``timeout`` seconds at most) says, for a log
    line or a client."""
    if isinstance(error, WireError) and error.code == Errors.REQUEST_TIMED_OUT:
        return f"no answer within {timeout:g} s"
    return str(error)
