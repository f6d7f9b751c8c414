"""The broker: executes model commands against the storage engine.

Runs in the reactor thread. Every command returns a ``Deferred`` that fires
with its result object; failures the client should hear about are results
with ``error`` set, never errbacks. Waiting (long-poll fetches, acks=all,
fsync group commit) never blocks the reactor.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import logging
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet import defer, task, threads
from twisted.internet.interfaces import IReactorTime

from gateway import idempotence
from gateway import model as m
from gateway.codec import BatchFormat
from gateway.convert import ConversionCache, convert
from gateway.model import CommandError, Error, ErrorCode
from gateway.partitioners import choose
from gateway.rebalance import ConsumerRebalance
from gateway.storage.engine import Engine

log = logging.getLogger(__name__)


@attrs.frozen
class FsyncPolicy:
    """``always`` (acknowledge after fsync, one fsync per group of writes),
    ``interval`` (fsync every ``interval_ms``) or ``never`` (leave it to the OS)."""

    mode: str = "interval"
    interval_ms: int = 1000

    @classmethod
    def parse(cls, text: str) -> FsyncPolicy:
        if text in ("always", "never"):
            return cls(text, 0)
        if text.startswith("interval:") and text[9:].isdigit() and int(text[9:]) > 0:
            return cls("interval", int(text[9:]))
        raise ValueError(f"fsync policy must be always, never or interval:<ms>, not {text!r}")


@attrs.frozen
class BrokerConfig:
    ack_timeout_ms: int = 2000
    fsync: FsyncPolicy = FsyncPolicy()
    retention_check_ms: int = 60_000
    housekeeping_ms: int = 1000
    conversion_cache_bytes: int = 64 << 20
    auto_create_topics: bool = True
    group_session_timeout_ms: int = 10_000


class GroupCommit:
    """Acknowledge writes only once fsynced, sharing one fsync among all the
    writes made while the previous fsync ran (policy ``always``)."""

    def __init__(self, engine: Engine, reactor: Any):
        self.engine = engine
        self.reactor = reactor
        self.written = 0
        self.synced = 0
        self.waiters: collections.deque[tuple[int, defer.Deferred]] = collections.deque()
        self.running = False
        self.fsyncs = 0

    def durable(self) -> defer.Deferred:
        self.written += 1
        d: defer.Deferred = defer.Deferred()
        self.waiters.append((self.written, d))
        if not self.running:
            self.running = True
            self.reactor.callLater(0, self._sync)
        return d

    def _sync(self) -> None:
        target = self.written
        d = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), self.engine.sync)

        def done(result: Any) -> None:
            self.fsyncs += 1
            if isinstance(result, defer.Failure):
                log.error("fsync failed: %s", result.getErrorMessage())
            self.synced = target
            while self.waiters and self.waiters[0][0] <= target:
                self.waiters.popleft()[1].callback(None)
            if self.written > self.synced:
                self._sync()
            else:
                self.running = False

        d.addBoth(done)


def _errors(result_type: Callable[..., Any], *args: Any) -> Callable[[Callable], Callable]:
    """Turn a ``CommandError`` raised by a handler into ``result_type(*args, error=...)``."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(self: Broker, cmd: Any) -> Any:
            try:
                return fn(self, cmd)
            except CommandError as e:
                fields = {a: getattr(cmd, a) for a in args}
                return result_type(**fields, error=e.error)

        return run

    return wrap


_ACKS_TIMEOUT = Error(ErrorCode.REPLICATION_TIMEOUT, "acks=all timeout")


class Broker:
    """Executes commands; ``formats`` maps storage format names to ``BatchFormat``s."""

    def __init__(self, engine: Engine, formats: dict[str, BatchFormat], reactor: IReactorTime,
                 config: BrokerConfig | None = None):
        self.engine = engine
        self.formats = formats
        self.reactor = reactor
        self.config = config or BrokerConfig()
        self.commit = GroupCommit(engine, reactor)
        self.cache = ConversionCache(self.config.conversion_cache_bytes)
        self._round_robin = itertools.count()
        self._loops: list[task.LoopingCall] = []
        self.listeners: tuple[tuple[str, str, int], ...] = ()
        self.rebalance = ConsumerRebalance(engine.groups, reactor)
        self._handlers: dict[type, Callable[[Any], Any]] = {
            m.Produce: self.produce,
            m.ProduceRecords: self.produce_records,
            m.Fetch: self.fetch,
            m.FetchMany: self.fetch_many,
            m.ListOffsets: self.list_offsets,
            m.CreateTopic: self.create_topic,
            m.DeleteTopic: self.delete_topic,
            m.CreatePartitions: self.create_partitions,
            m.ListTopics: self.list_topics,
            m.JoinGroup: self.join_group,
            m.SyncGroup: self.sync_group,
            m.Heartbeat: self.heartbeat,
            m.LeaveGroup: self.leave_group,
            m.CommitOffsets: self.commit_offsets,
            m.FetchOffsets: self.fetch_offsets,
            m.DescribeGroups: self.describe_groups,
            m.ListGroups: self.list_groups,
            m.DeleteGroups: self.delete_groups,
            m.ReplicaProgress: self.replica_progress,
            m.SetPartitionRole: self.set_partition_role,
            m.Ping: lambda cmd: m.PingResult(),
            m.InitProducerId: self.init_producer_id,
            m.ServerInfo: self.server_info,
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start housekeeping: group expiry, ISR lag, retention, fsync interval."""
        every = [
            (self.config.housekeeping_ms, self._housekeeping),
            (self.config.retention_check_ms, self.engine.enforce_retention),
        ]
        if self.config.fsync.mode == "interval":
            every.append((self.config.fsync.interval_ms, self._interval_sync))
        for ms, fn in every:
            loop = task.LoopingCall(fn)
            loop.clock = self.reactor
            loop.start(ms / 1000, now=False).addErrback(lambda f: log.error("housekeeping: %s", f))
            self._loops.append(loop)

    def stop(self) -> None:
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops.clear()

    def _housekeeping(self) -> None:
        for name in self.engine.groups.expire_all():
            self.rebalance.changed(name)
        self.engine.refresh_watermarks()
        self.engine.compact_journal()

    def _interval_sync(self) -> defer.Deferred | None:
        if self.engine.dirty:
            return threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), self.engine.sync)
        return None

    def _durable(self, value: Any) -> Any:
        """``value`` once the writes made so far are durable under the fsync policy."""
        if self.config.fsync.mode == "always":
            return self.commit.durable().addCallback(lambda _: value)
        return value

    # ------------------------------------------------------------------ dispatch

    def run(self, command: Any) -> Any:
        """Run ``command``: its result, or a Deferred of it when it has to wait.

        The hot path: most commands complete at once and need no Deferred.
        Raises on a bug (an unknown command, an unexpected exception).
        """
        handler = self._handlers.get(type(command))
        if handler is None:
            raise TypeError(f"no handler for {type(command).__name__}")
        return handler(command)

    def execute(self, command: Any) -> defer.Deferred:
        """Run ``command``; the Deferred fires with its result."""
        return defer.maybeDeferred(self.run, command)

    # ------------------------------------------------------------------ topics

    def _ensure_topic(self, topic: str, auto_create: bool) -> None:
        if topic not in self.engine.topics and auto_create and self.config.auto_create_topics:
            self.engine.create_topic(topic)

    @_errors(m.CreateTopicResult, "topic")
    def create_topic(self, cmd: m.CreateTopic) -> Any:
        existing = self.engine.topics.get(cmd.topic)
        if existing is not None and cmd.if_not_exists:
            if cmd.partitions and cmd.partitions > len(existing.partitions):
                self.engine.add_partitions(cmd.topic, cmd.partitions)
            return self._durable(m.CreateTopicResult(cmd.topic, len(existing.partitions), config=existing.config))
        t = self.engine.create_topic(cmd.topic, cmd.partitions, cmd.config)
        return self._durable(m.CreateTopicResult(cmd.topic, len(t.partitions), config=t.config))

    @_errors(m.DeleteTopicResult, "topic")
    def delete_topic(self, cmd: m.DeleteTopic) -> Any:
        self.engine.delete_topic(cmd.topic)
        self.cache.clear()
        return self._durable(m.DeleteTopicResult(cmd.topic))

    @_errors(m.CreatePartitionsResult, "topic")
    def create_partitions(self, cmd: m.CreatePartitions) -> Any:
        self.engine.add_partitions(cmd.topic, cmd.count)
        return self._durable(m.CreatePartitionsResult(cmd.topic))

    def list_topics(self, cmd: m.ListTopics) -> m.ListTopicsResult:
        names = sorted(self.engine.topics) if cmd.topics is None else cmd.topics
        out = []
        for name in names:
            try:
                self._ensure_topic(name, cmd.auto_create)
                out.append(self.engine.topic_info(name))
            except CommandError as e:
                out.append(m.TopicInfo(name, error=e.error))
        return m.ListTopicsResult(tuple(out))

    # ------------------------------------------------------------------ produce

    @_errors(m.ProduceResult, "topic")
    def produce(self, cmd: m.Produce) -> Any:
        self._ensure_topic(cmd.topic, cmd.auto_create)
        topic = self.engine.topic(cmd.topic)
        if cmd.partition is None:
            partition = choose(cmd.partitioner, cmd.key, len(topic.partitions), next(self._round_robin))
        else:
            partition = cmd.partition
        batch = cmd.batch
        fmt = self._format(batch.format)
        part = self._leader(cmd.topic, partition)
        producer = batch.producer
        state = None
        if producer is not None:
            state = self.engine.producer_state(cmd.topic, partition, producer.producer_id)
            duplicate = idempotence.check(state, producer)
            if duplicate is not None:
                return m.ProduceResult(cmd.topic, partition, duplicate[0], duplicate[1], part.high_watermark,
                                       part.log_start_offset, duplicate=True)
        base = part.log_end_offset if batch.base_offset is None else batch.base_offset
        payload = fmt.assign_offsets(batch.payload, base)
        base, last = self.engine.append(cmd.topic, partition, batch.format, payload, batch.count,
                                        batch.max_timestamp, batch.base_offset)
        if producer is not None:
            self.engine.set_producer_state(cmd.topic, partition, producer.producer_id,
                                           idempotence.after_append(state, producer, base, last))

        def result(timed_out: frozenset[int]) -> m.ProduceResult:
            return m.ProduceResult(cmd.topic, partition, base, last, part.high_watermark,
                                   part.log_start_offset, error=_ACKS_TIMEOUT if timed_out else None)

        return self._acknowledge(cmd, {partition: last}, result)

    @_errors(m.ProduceRecordsResult, "topic")
    def produce_records(self, cmd: m.ProduceRecords) -> Any:
        self._ensure_topic(cmd.topic, cmd.auto_create)
        count = len(self.engine.topic(cmd.topic).partitions)
        fmt = self._format(cmd.format)
        if not fmt.joinable:
            raise CommandError(ErrorCode.UNSUPPORTED, f"{cmd.format!r} payloads cannot be joined")
        routed: dict[int, list[int]] = {}  # partition -> indexes of its records
        for i, key in enumerate(cmd.keys):
            routed.setdefault(choose(cmd.partitioner, key, count, next(self._round_robin)), []).append(i)
        bases: dict[int, int] = {}
        lasts: dict[int, int] = {}
        errors: dict[int, Error] = {}
        for partition, indexes in routed.items():
            try:
                base = self._leader(cmd.topic, partition).log_end_offset
                payload = fmt.assign_offsets(b"".join([cmd.payloads[i] for i in indexes]), base)
                bases[partition], lasts[partition] = self.engine.append(
                    cmd.topic, partition, cmd.format, payload, len(indexes), max(cmd.timestamps[i] for i in indexes))
            except CommandError as e:
                errors[partition] = e.error

        def result(timed_out: frozenset[int]) -> m.ProduceRecordsResult:
            results: list[m.ProduceResult] = [None] * len(cmd.payloads)  # type: ignore[list-item]
            for partition, indexes in routed.items():
                if partition in errors:
                    for i in indexes:
                        results[i] = m.ProduceResult(cmd.topic, partition, error=errors[partition])
                    continue
                part = self.engine.partition(cmd.topic, partition)
                hw, start = part.high_watermark, part.log_start_offset
                error = _ACKS_TIMEOUT if partition in timed_out else None
                for offset, i in enumerate(indexes, bases[partition]):  # the hw once this record was in
                    results[i] = m.ProduceResult(cmd.topic, partition, offset, offset, min(hw, offset + 1), start,
                                                 error=error)
            return m.ProduceRecordsResult(cmd.topic, tuple(results))

        return self._acknowledge(cmd, lasts, result)

    def _acknowledge(self, cmd: m.Produce | m.ProduceRecords, lasts: dict[int, int],
                     result: Callable[[frozenset[int]], Any]) -> Any:
        """``result(partitions that timed out)`` once ``cmd.acks`` holds for the offsets up to
        ``lasts[partition]`` (at once but for acks=all), and the writes are durable."""
        if not lasts:  # nothing was appended: nothing to wait for
            return result(frozenset())
        if cmd.acks != m.Acks.ALL:
            return self._durable(result(frozenset()))
        timeout_ms = cmd.timeout_ms if cmd.timeout_ms is not None else self.config.ack_timeout_ms
        waits = [self._await_replication(cmd.topic, p, last, timeout_ms) for p, last in lasts.items()]
        d = waits[0].addCallback(lambda ok: [ok]) if len(waits) == 1 else defer.gatherResults(
            waits, consumeErrors=True).addErrback(lambda f: f.value.subFailure if f.check(defer.FirstError) else f)
        d.addCallback(lambda oks: result(frozenset(p for p, ok in zip(lasts, oks, strict=True) if not ok)))
        return d.addCallback(self._durable)

    def _format(self, name: str) -> BatchFormat:
        fmt = self.formats.get(name)
        if fmt is None:
            raise CommandError(ErrorCode.UNSUPPORTED, f"no storage format {name!r}")
        return fmt

    def _leader(self, topic: str, partition: int) -> Any:
        """The partition, if this broker leads it (else ``NOT_LEADER``)."""
        part = self.engine.partition(topic, partition)
        if part.replicas.role != "leader":
            raise CommandError(ErrorCode.NOT_LEADER, "partition leader unavailable on this broker")
        return part

    def _await_replication(self, topic: str, partition: int, last: int, timeout_ms: int) -> defer.Deferred:
        """Fire True once the high watermark passes ``last`` with enough
        replicas in sync, False after ``timeout_ms``."""
        d: defer.Deferred = defer.Deferred()
        state: dict[str, Any] = {}

        def satisfied() -> bool:
            part = self.engine.partition(topic, partition)
            return part.high_watermark > last and part.replicas.enough_replicas(
                part.log_end_offset, self.engine.now_ms())

        def check() -> None:
            try:
                ok = satisfied()
            except CommandError:
                ok = False
                finish(False)
                return
            if ok:
                finish(True)
            else:
                state["cancel"] = self.engine.wait_for_data(topic, partition, check)

        def finish(ok: bool) -> None:
            if d.called:
                return
            if state.get("cancel"):
                state["cancel"]()
            timer = state.get("timer")
            if timer and timer.active():
                timer.cancel()
            d.callback(ok)

        state["timer"] = self.reactor.callLater(timeout_ms / 1000, lambda: finish(False))
        check()
        return d

    # ------------------------------------------------------------------ fetch

    def _start_offset(self, cmd: m.Fetch, part: Any) -> int:
        if cmd.group is not None:
            committed = self.engine.groups.committed(cmd.group, cmd.topic, cmd.partition)
            if committed is not None and committed[0] >= 0:
                return committed[0]
        if cmd.offset == m.OffsetSpec.EARLIEST:
            return part.log_start_offset
        if cmd.offset == m.OffsetSpec.LATEST:
            return part.high_watermark
        return cmd.offset

    def _read(self, cmd: m.Fetch, max_bytes: int | None = None) -> m.FetchResult:
        """Read now, without waiting; errors come back in the result."""
        try:
            part = self.engine.partition(cmd.topic, cmd.partition)
        except CommandError as e:
            return m.FetchResult(cmd.topic, cmd.partition, error=e.error, offset=cmd.offset)
        hw = part.high_watermark
        start = part.log_start_offset
        offset = self._start_offset(cmd, part)
        if offset < start or offset > max(hw, part.log_end_offset):
            return m.FetchResult(cmd.topic, cmd.partition, hw, start, hw, offset=offset,
                                 error=Error(ErrorCode.OFFSET_OUT_OF_RANGE,
                                             f"offset {offset} is outside [{start}, {hw}]"))
        limit = cmd.max_bytes if max_bytes is None else min(max_bytes, cmd.max_bytes)
        stored = part.log.read(offset, limit, hw) if limit > 0 else []
        tid = part.topic.topic_id
        try:
            batches = tuple(convert(stored, cmd.format, self.formats, self.cache, (tid, cmd.partition)))
        except CommandError as e:
            return m.FetchResult(cmd.topic, cmd.partition, hw, start, hw, offset=offset, error=e.error)
        return m.FetchResult(cmd.topic, cmd.partition, hw, start, hw, batches, offset=offset)

    def _read_many(self, cmd: m.FetchMany) -> tuple[m.FetchResult, ...]:
        out = []
        budget = cmd.max_bytes
        for f in cmd.fetches:
            r = self._read(f, budget if out and any(o.batches for o in out) else max(budget, 1))
            budget -= r.size
            out.append(r)
        return tuple(out)

    def fetch(self, cmd: m.Fetch) -> Any:
        many = m.FetchMany((cmd,), cmd.max_wait_ms, cmd.min_bytes, cmd.max_bytes)
        result = self.fetch_many(many)
        if isinstance(result, defer.Deferred):
            return result.addCallback(lambda r: r.results[0])
        return result.results[0]

    def fetch_many(self, cmd: m.FetchMany) -> Any:
        """Answer at once if there is ``min_bytes`` of data (or an error, or no
        wait asked); otherwise when an append brings enough, or at the timeout."""
        # Resolve EARLIEST/LATEST/group offsets once, so that waiting for "latest"
        # waits for records appended after the request arrived.
        fetches = []
        for f in cmd.fetches:
            try:
                part = self.engine.partition(f.topic, f.partition)
                fetches.append(attrs.evolve(f, offset=self._start_offset(f, part), group=None))
            except CommandError:
                fetches.append(f)
        cmd = attrs.evolve(cmd, fetches=tuple(fetches))
        results = self._read_many(cmd)

        def enough(rs: tuple[m.FetchResult, ...]) -> bool:
            return (any(r.error for r in rs) or sum(r.size for r in rs) >= cmd.min_bytes)

        if cmd.max_wait_ms <= 0 or enough(results):
            return m.FetchManyResult(results)
        state: dict[str, Any] = {"cancels": []}

        def cancel_waits() -> None:
            for c in state["cancels"]:
                c()
            state["cancels"] = []

        def wait() -> None:
            for f in cmd.fetches:
                with contextlib.suppress(CommandError):
                    state["cancels"].append(self.engine.wait_for_data(f.topic, f.partition, changed))

        def changed() -> None:
            if d.called:
                return
            cancel_waits()
            rs = self._read_many(cmd)
            if enough(rs):
                finish(rs)
            else:
                wait()

        def finish(rs: tuple[m.FetchResult, ...] | None = None) -> None:
            cancel_waits()
            timer = state.get("timer")
            if timer and timer.active():
                timer.cancel()
            if not d.called:
                d.callback(m.FetchManyResult(rs if rs is not None else self._read_many(cmd)))

        d: defer.Deferred = defer.Deferred(lambda _: finish(()))
        state["timer"] = self.reactor.callLater(cmd.max_wait_ms / 1000, finish)
        wait()
        return d

    @_errors(m.ListOffsetsResult, "topic", "partition")
    def list_offsets(self, cmd: m.ListOffsets) -> m.ListOffsetsResult:
        part = self.engine.partition(cmd.topic, cmd.partition)
        if cmd.timestamp == m.OffsetSpec.EARLIEST:
            return m.ListOffsetsResult(cmd.topic, cmd.partition, part.log_start_offset)
        if cmd.timestamp == m.OffsetSpec.LATEST:
            return m.ListOffsetsResult(cmd.topic, cmd.partition, part.high_watermark)
        if cmd.timestamp == m.OffsetSpec.MAX_TIMESTAMP:
            offset, ts = part.log.max_timestamp_offset()
            return m.ListOffsetsResult(cmd.topic, cmd.partition, offset, ts)
        offset = part.log.offset_for_timestamp(cmd.timestamp)
        if offset is None or offset >= part.high_watermark:
            return m.ListOffsetsResult(cmd.topic, cmd.partition, -1, -1)
        offset, ts = self._first_record_at(part, max(offset, part.log_start_offset), cmd.timestamp)
        return m.ListOffsetsResult(cmd.topic, cmd.partition, offset, ts)

    def _first_record_at(self, part: Any, offset: int, timestamp: int) -> tuple[int, int]:
        """Within the batch found by the time index, the first record at or after ``timestamp``."""
        for batch in part.log.read(offset, 1, part.high_watermark)[:1]:
            fmt = self.formats.get(batch.format)
            for record in fmt.records(batch) if fmt is not None else ():
                if record.offset >= offset and record.timestamp >= timestamp:
                    return record.offset, record.timestamp
        return offset, timestamp

    # ------------------------------------------------------------------ groups

    def _assignment(self, group: Any, member_id: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
        owned = self.engine.groups.assignment_of(group, member_id)
        return tuple((t, tuple(ps)) for t, ps in sorted(owned.items()))

    @_errors(m.JoinGroupResult, "group")
    def join_group(self, cmd: m.JoinGroup) -> Any:
        if cmd.protocol_type == "consumer":
            return self.rebalance.join(cmd)
        if cmd.protocol_type != "server":
            raise CommandError(ErrorCode.UNSUPPORTED, f"membership protocol {cmd.protocol_type!r}")
        for t in cmd.topics:
            self._ensure_topic(t, True)
        group = self.engine.groups.join_server(cmd.group, cmd.member_id, cmd.topics, cmd.assignor,
                                               cmd.session_timeout_ms or self.config.group_session_timeout_ms,
                                               cmd.client_id, cmd.client_host)
        return self._durable(m.JoinGroupResult(cmd.group, cmd.member_id, group.generation,
                                               self._assignment(group, cmd.member_id)))

    @_errors(m.SyncGroupResult, "group")
    def sync_group(self, cmd: m.SyncGroup) -> Any:
        groups = self.engine.groups
        if self._consumer_group(cmd.group):
            return self.rebalance.sync(cmd)
        group = groups.check_member(cmd.group, cmd.member_id, cmd.generation)
        group.members[cmd.member_id].last_heartbeat_ms = self.engine.now_ms()
        return m.SyncGroupResult(cmd.group, group.generation, self._assignment(group, cmd.member_id))

    def _consumer_group(self, name: str) -> bool:
        group = self.engine.groups.groups.get(name)
        return group is not None and group.protocol_type == "consumer"

    @_errors(m.HeartbeatResult, "group")
    def heartbeat(self, cmd: m.Heartbeat) -> m.HeartbeatResult:
        self.engine.groups.heartbeat(cmd.group, cmd.member_id, cmd.generation)
        return m.HeartbeatResult(cmd.group)

    @_errors(m.LeaveGroupResult, "group")
    def leave_group(self, cmd: m.LeaveGroup) -> Any:
        self.engine.groups.leave(cmd.group, cmd.member_id, cmd.generation)
        self.rebalance.changed(cmd.group)
        return self._durable(m.LeaveGroupResult(cmd.group))

    @_errors(m.CommitOffsetsResult, "group")
    def commit_offsets(self, cmd: m.CommitOffsets) -> Any:
        self.engine.groups.commit(cmd.group, cmd.offsets, cmd.member_id, cmd.generation,
                                  cmd.require_assignment)
        return self._durable(m.CommitOffsetsResult(
            cmd.group, tuple((t, p, None) for t, p, _, _ in cmd.offsets)))

    def fetch_offsets(self, cmd: m.FetchOffsets) -> m.FetchOffsetsResult:
        groups = self.engine.groups
        if cmd.partitions is None:
            found = groups.committed_all(cmd.group)
            return m.FetchOffsetsResult(cmd.group, tuple(
                (t, p, o, meta) for (t, p), (o, meta) in sorted(found.items())))
        out = []
        for t, p in cmd.partitions:
            c = groups.committed(cmd.group, t, p)
            out.append((t, p, c[0], c[1]) if c else (t, p, -1, ""))
        return m.FetchOffsetsResult(cmd.group, tuple(out))

    def describe_groups(self, cmd: m.DescribeGroups) -> m.DescribeGroupsResult:
        out = []
        for name in cmd.groups:
            group = self.engine.groups.groups.get(name)
            if group is None:
                out.append(m.GroupInfo(name, "Dead"))
                continue
            members = tuple(
                m.GroupMemberInfo(mem.member_id, mem.client_id, mem.client_host, group.protocol_type,
                                  dict(mem.protocols).get(group.protocol, b""), mem.assignment,
                                  self._assignment(group, mem.member_id))
                for mem in group.members.values()
            )
            out.append(m.GroupInfo(name, group.state, group.protocol_type,
                                   group.protocol or group.assignor, group.generation, members))
        return m.DescribeGroupsResult(tuple(out))

    def list_groups(self, cmd: m.ListGroups) -> m.ListGroupsResult:
        groups = self.engine.groups
        names = set(groups.groups) | set(groups.offsets)
        return m.ListGroupsResult(tuple(
            (n, groups.groups[n].protocol_type if n in groups.groups else "") for n in sorted(names)))

    def delete_groups(self, cmd: m.DeleteGroups) -> Any:
        errors = []
        for name in cmd.groups:
            try:
                self.engine.groups.delete(name)
                errors.append((name, None))
            except CommandError as e:
                errors.append((name, e.error))
        return self._durable(m.DeleteGroupsResult(tuple(errors)))

    # ------------------------------------------------------------------ replication

    @_errors(m.ReplicaProgressResult, "topic", "partition", "replica_id")
    def replica_progress(self, cmd: m.ReplicaProgress) -> m.ReplicaProgressResult:
        part = self.engine.report_replica(cmd.topic, cmd.partition, cmd.replica_id, cmd.offset)
        now = self.engine.now_ms()
        isr = part.replicas.isr(part.log_end_offset, now)
        return m.ReplicaProgressResult(cmd.topic, cmd.partition, cmd.replica_id, cmd.offset,
                                       part.high_watermark, isr,
                                       len(isr) < part.replicas.replication_factor)

    @_errors(m.SetPartitionRoleResult, "topic", "partition")
    def set_partition_role(self, cmd: m.SetPartitionRole) -> m.SetPartitionRoleResult:
        if cmd.role not in ("leader", "follower"):
            raise CommandError(ErrorCode.INVALID_REQUEST, "invalid role")
        part = self.engine.set_role(cmd.topic, cmd.partition, cmd.role)
        return m.SetPartitionRoleResult(cmd.topic, cmd.partition, cmd.role, part.high_watermark)

    # ------------------------------------------------------------------ misc

    def init_producer_id(self, cmd: m.InitProducerId) -> Any:
        if cmd.producer_id >= 0:
            return self._durable(m.InitProducerIdResult(cmd.producer_id, cmd.epoch + 1))
        return self._durable(m.InitProducerIdResult(self.engine.allocate_producer_id(), 0))

    def server_info(self, cmd: m.ServerInfo) -> m.ServerInfoResult:
        topics = self.engine.topics.values()
        return m.ServerInfoResult(self.engine.started_at, len(topics),
                                  sum(len(t.partitions) for t in topics), self.listeners)
