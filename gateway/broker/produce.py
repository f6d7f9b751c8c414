"""Appending: produce commands, merging pipelined produces, and acks.

A produce is acknowledged once ``acks`` holds (acks=all: the high watermark
passed its last offset with enough replicas in sync, or the timeout) and the
write is durable under the fsync policy.

On a store without ``ReplicatingStorage`` this broker leads every partition and
acks=all waits for the high watermark alone; a store that ``assigns_offsets``
gets payloads as produced, not numbered here. A batch of a ``CompressingFormat``
is stored in the compression its topic's ``compression.type`` names (as Kafka
recompresses on append), unless the store ``compresses`` itself.

An idempotent producer's batches go through ``idempotence.Sequences``, which
also answers the batches sent behind one that failed retriably.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from twisted.internet import defer
from twisted.python.failure import Failure

from gateway import model as m
from gateway.broker import idempotence
from gateway.broker.calls import (
    command_error,
    errors_as,
    fan_out,
    first_failure,
    gather,
    then,
    unknown_leader_epoch,
)
from gateway.codec import BatchFormat
from gateway.codec.formats import ONE_RECORD, has_leader_epochs, is_compressing
from gateway.model import CommandError, Error, ErrorCode
from gateway.partitioners import choose
from gateway.storage.interface import LeaderEpochStorage, MayWait, ReplicatingStorage

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.codec.formats import Validated

ACKS_TIMEOUT = Error(ErrorCode.REPLICATION_TIMEOUT, "acks=all timeout")
MERGE_BYTES = 1 << 20  # a run of merged produces stops once its payloads reach this size...
MERGE_RECORDS = 4096  # ...or this many records
KEYED_CHOICES = 4096  # keyed partition choices remembered (all forgotten past this many), ...
KEYED_KEY_BYTES = 256  # ... each for a key of at most this size: at most 1 MiB of keys


class Producer:
    def __init__(self, broker: Broker):
        self.broker = broker
        self.store = store = broker.store
        self._is_leader: Callable[[str, int], bool]
        self._enough_replicas: Callable[[str, int], bool]
        if store.replicates:
            replicating = cast(ReplicatingStorage, store)
            self._is_leader, self._enough_replicas = replicating.is_leader, replicating.enough_replicas
        else:
            self._is_leader, self._enough_replicas = self._has_partition, _no_replicas_to_wait_for
        self._leader_epoch: Callable[[str, int], int] = (
            cast(LeaderEpochStorage, store).leader_epoch if store.leader_epochs else unknown_leader_epoch)
        # ``numbered(fmt, payload, base, topic, partition)``: ``payload`` as its append stores it.
        self.numbered: Callable[[BatchFormat, bytes, int, str, int], bytes] = (
            _as_produced if store.assigns_offsets else self._numbered)
        # ``compressed(fmt, payload, topic)``: ``payload`` in its topic's compression.type.
        self.compressed: Callable[[BatchFormat, bytes, str], bytes] = (
            _as_compressed if store.compresses else self._compressed)
        self._round_robin = itertools.count()
        self._default_cleanup = store.topic_defaults().cleanup_policy or "delete"  # a topic's unless it sets one
        self._keyed: dict[tuple[bytes | None, str, int], int] = {}  # see _route (it stores bytes keys only)
        # (topic, partition, producer id) -> fires when that producer's last batch there is settled
        self._in_order: dict[tuple[str, int, Any], defer.Deferred] = {}
        self._sequences = idempotence.Sequences()

    def format(self, name: str) -> BatchFormat:
        fmt = self.broker.formats.get(name)
        if fmt is None:
            raise CommandError(ErrorCode.UNSUPPORTED, f"no storage format {name!r}")
        return fmt

    def check_leader(self, topic: str, partition: int) -> None:
        """Raise ``NOT_LEADER`` unless this broker leads the partition."""
        if not self._is_leader(topic, partition):
            raise CommandError(ErrorCode.NOT_LEADER, "partition leader unavailable on this broker")

    def _has_partition(self, topic: str, partition: int) -> bool:
        """``is_leader`` of a store that replicates by itself: this broker leads each of its
        partitions; ``UNKNOWN_TOPIC``/``UNKNOWN_PARTITION`` for one it does not have."""
        self.store.log_end_offset(topic, partition)
        return True

    def _numbered(self, fmt: BatchFormat, payload: bytes, base: int, topic: str, partition: int) -> bytes:
        """``payload`` numbered from ``base`` for its append, and stamped with the partition's
        leader epoch when its batches carry one (``LeaderEpochFormat``)."""
        if has_leader_epochs(fmt):
            return fmt.assign_offsets_in_epoch(payload, base, self._leader_epoch(topic, partition))
        return fmt.assign_offsets(payload, base)

    def _compacted(self, topic: str) -> bool:
        """Whether ``topic`` is compacted (``cleanup.policy`` ``compact`` or ``compact,delete``): as
        Kafka's, it takes keyed records only, whatever protocol writes them."""
        return "compact" in (self.store.topic_config(topic).cleanup_policy or self._default_cleanup)

    def _compressed(self, fmt: BatchFormat, payload: bytes, topic: str) -> bytes:
        """``payload`` recompressed as its topic's ``compression.type`` names, when its format
        names compressions (``CompressingFormat``) and the topic does not keep what producers send."""
        if not is_compressing(fmt):
            return payload
        wanted = self.store.topic_config(topic).compression_type
        return payload if wanted is None or wanted == "producer" else fmt.recompress(payload, wanted)

    def _route(self, cmd: m.Produce, partitions: int) -> int:
        """The partition of ``cmd``: its own, or its partitioner's choice for its key. Bursts
        send many records with a few keys (MQTT topic names, V1 keys): keyed choices are
        remembered, up to ``KEYED_CHOICES`` of them, of keys up to ``KEYED_KEY_BYTES``
        (``_produce_merged`` looks a remembered one up itself, before calling this). The
        round-robin turn moves on with each choice that takes it (a keyless or round-robin
        produce) only, so that remembering a keyed choice changes no turn."""
        if cmd.partition is not None:
            return cmd.partition
        if partitions == 1:  # every partitioner's choice, without hashing the key
            return 0
        key, partitioner = cmd.key, cmd.partitioner
        if key is None or partitioner == "round_robin":
            return choose(partitioner, key, partitions, next(self._round_robin))
        if len(key) > KEYED_KEY_BYTES:
            return choose(partitioner, key, partitions, 0)  # (a keyed choice takes no turn)
        keyed = self._keyed
        partition = keyed.get((key, partitioner, partitions))
        if partition is None:
            if len(keyed) >= KEYED_CHOICES:
                keyed.clear()
            partition = keyed[key, partitioner, partitions] = choose(partitioner, key, partitions, 0)
        return partition

    # ------------------------------------------------------------------ one batch

    @errors_as(m.ProduceResult, "topic")
    def produce(self, cmd: m.Produce) -> MayWait[m.ProduceResult]:
        m.check_appendable(cmd.topic)
        try:
            ensured = self.broker.topics.ensure(cmd.topic, cmd.auto_create)
            return then(ensured, lambda _: self._produce(cmd))
        except CommandError as e:  # before or at the check (a cluster that does not answer): remembered too
            producer = cmd.batch.producer
            if producer is not None and cmd.partition is not None:
                self._sequences.failed((cmd.topic, cmd.partition, producer.producer_id), producer, e.error)
            raise

    def _produce(self, cmd: m.Produce) -> Any:
        partition = cmd.partition
        if partition is None:
            partition = self._route(cmd, self.store.partition_count(cmd.topic))
        batch = cmd.batch
        fmt = self.format(batch.format)
        refusal = refused(fmt, batch)
        if refusal is not None:
            raise CommandError(refusal.code, refusal.message)
        if self._compacted(cmd.topic):
            missing = fmt.keyless(batch)
            if missing:
                return keyless_refused(cmd.topic, partition, missing)
        self.check_leader(cmd.topic, partition)
        producer = batch.producer
        if producer is None:
            return self._append(cmd, partition, fmt, None, None)
        if producer.transactional:
            self.broker.transactions.check_produce(cmd.topic, partition, producer)
        key = (cmd.topic, partition, producer.producer_id)
        before = self._in_order.get(key)
        if before is None:
            answer = self._checked(cmd, partition, fmt, producer)
            if not isinstance(answer, defer.Deferred):
                return answer  # the local engine: checked and appended at once
        else:
            answer = before.addBoth(lambda _: self._checked(cmd, partition, fmt, producer))
        # A store that waits (a cluster): the next batch of this producer to this partition
        # is checked only once this one is appended and its state stored.
        done: defer.Deferred = defer.Deferred()
        self._in_order[key] = done

        def settled(outcome: Any) -> Any:
            if self._in_order.get(key) is done:
                del self._in_order[key]
            done.callback(None)
            return outcome

        return answer.addBoth(settled)

    def _checked(self, cmd: m.Produce, partition: int, fmt: BatchFormat, producer: m.ProducerState) -> Any:
        """Apply the producer's idempotence rules to its state (which a store may have to look up),
        and append unless it is a duplicate; a failure its client retries is remembered."""
        key = (cmd.topic, partition, producer.producer_id)

        def check(state: dict[str, Any] | None) -> Any:
            duplicate = self._sequences.check(key, state, producer)
            if duplicate is not None:
                return m.ProduceResult(cmd.topic, partition, duplicate[0], duplicate[1],
                                       self.store.high_watermark(cmd.topic, partition),
                                       self.store.log_start_offset(cmd.topic, partition), duplicate=True)
            return self._append(cmd, partition, fmt, producer, state)

        def stored(result: m.ProduceResult) -> m.ProduceResult:
            self._sequences.stored(key)
            return result

        def failed(f: Failure) -> Failure:
            if isinstance(f.value, CommandError):
                self._sequences.failed(key, producer, f.value.error)
            return f

        try:
            checked = then(self.store.producer_state(cmd.topic, partition, producer.producer_id), check)
        except CommandError as e:
            self._sequences.failed(key, producer, e.error)
            raise
        return checked.addCallbacks(stored, failed) if isinstance(checked, defer.Deferred) else stored(checked)

    def _append(self, cmd: m.Produce, partition: int, fmt: BatchFormat, producer: m.ProducerState | None,
                state: dict[str, Any] | None) -> Any:
        store = self.store
        batch = cmd.batch
        base = store.log_end_offset(cmd.topic, partition) if batch.base_offset is None else batch.base_offset
        payload = self.numbered(fmt, self.compressed(fmt, batch.payload, cmd.topic), base, cmd.topic, partition)

        def remember(offsets: tuple[int, int]) -> tuple[int, int]:
            if producer is not None:
                store.set_producer_state(cmd.topic, partition, producer.producer_id,
                                         idempotence.after_append(state, producer, *offsets))
            return offsets

        def appended(offsets: tuple[int, int]) -> Any:
            base, last = offsets

            def result(timed_out: frozenset[int]) -> m.ProduceResult:
                return m.ProduceResult(cmd.topic, partition, base, last, store.high_watermark(cmd.topic, partition),
                                       store.log_start_offset(cmd.topic, partition),
                                       error=ACKS_TIMEOUT if timed_out else None)

            return self.acknowledge(cmd, {partition: last}, result)

        def append(_: Any = None) -> MayWait[tuple[int, int]]:
            return store.append(cmd.topic, partition, batch.format, payload, batch.count, batch.max_timestamp,
                                batch.base_offset, cmd.acks, producer, cmd.timeout_ms)

        if producer is None:  # no producer state to remember, no transaction: the append alone
            appending = append()
        elif producer.transactional:
            # The first batch of a transaction on the partition holds its last stable offset, from
            # before the append: readers woken by the append must not see past it.
            opened = self.broker.transactions.appending(cmd.topic, partition, producer, base)
            appending = then(then(opened, append), remember)
        else:
            appending = then(append(), remember)
        if isinstance(appending, defer.Deferred):
            # What was stored is remembered whatever becomes of the request: a client that goes away
            # cancels waiting for its answer, not the append or its producer's state.
            return shielded(appending).addCallback(appended)
        return appended(appending)

    # ------------------------------------------------------------------ merged batches

    def merged_run(self, commands: Sequence[Any], start: int) -> int:
        """Where the run of ``commands`` from ``start`` that may share appends (``produce_merged``)
        ends: ``start + 1`` when ``commands[start]`` shares with none.

        Only plain batches (no idempotent producer, no explicit offset) of a
        ``joinable`` format that the store does not forward as they arrived
        (``forwards_format``) merge, and only with the same topic, format, acks,
        timeout and auto-creation; a run stops once its payloads reach
        ``MERGE_BYTES`` or ``MERGE_RECORDS`` (so that a stored batch stays a size a
        reader converts at once).
        """
        first, end, n = commands[start], start + 1, len(commands)
        if end == n or type(first) is not m.Produce:
            return end
        batch = first.batch
        name = batch.format
        fmt = self.broker.formats.get(name)
        if (batch.producer is not None or batch.base_offset is not None or fmt is None or not fmt.joinable
                or name == self.store.forwards_format):
            return end
        topic, acks, timeout_ms, auto_create = first.topic, first.acks, first.timeout_ms, first.auto_create
        size, records, produce = len(batch.payload), batch.count, m.Produce
        while end < n and size < MERGE_BYTES and records < MERGE_RECORDS:
            cmd = commands[end]
            if type(cmd) is not produce:
                break
            batch = cmd.batch
            if (batch.format != name or batch.producer is not None or batch.base_offset is not None
                    or cmd.topic != topic or cmd.acks != acks or cmd.timeout_ms != timeout_ms
                    or cmd.auto_create != auto_create):
                break
            size += len(batch.payload)
            records += batch.count
            end += 1
        return end

    def produce_merged(self, cmds: Sequence[m.Produce]) -> list[Any]:
        """Results of ``cmds`` (a ``merged_run``) as if produced one by one, but
        with one append per partition: each its own offsets, and the high watermark
        as once its last record was in. The results are values, or Deferreds when
        acknowledging waits (each partition's answers wait only for that partition)."""
        first = cmds[0]
        try:
            m.check_appendable(first.topic)
            ensured = self.broker.topics.ensure(first.topic, first.auto_create)
        except CommandError as e:
            return [m.ProduceResult(first.topic, error=e.error)] * len(cmds)
        if isinstance(ensured, defer.Deferred):
            answers = ensured.addCallback(lambda _: gather(self._produce_merged(cmds)))
            return fan_out(answers.addErrback(_as_results, first.topic, len(cmds)), len(cmds))
        return self._produce_merged(cmds)

    def _produce_merged(self, cmds: Sequence[m.Produce]) -> list[Any]:
        first = cmds[0]
        topic = first.topic
        try:
            partitions = self.store.partition_count(topic)
            fmt = self.format(first.batch.format)
        except CommandError as e:
            return [m.ProduceResult(topic, error=e.error)] * len(cmds)
        routed: dict[int, list[int]] = {}  # partition -> indexes of its commands, in order
        results: list[Any] = [None] * len(cmds)
        route, remembered = self._route, self._keyed.get
        batches = [cmd.batch for cmd in cmds]
        checks = fmt.validate_each([batch.payload for batch in batches])
        compacted = self._compacted(topic)
        for i, cmd, batch, checked in zip(range(len(cmds)), cmds, batches, checks, strict=True):
            # (The usual batch, one record checked, is told at once: this runs once per produce.)
            refusal = None if checked is ONE_RECORD and batch.count == 1 else refusal_of(checked, batch)
            missing = fmt.keyless(batch) if compacted and refusal is None else ()
            if missing:
                results[i] = keyless_refused(topic, -1 if cmd.partition is None else cmd.partition, missing)
            elif refusal is None:
                # A keyed choice _route remembered, looked up without calling it (a burst repeats
                # a few keys): only _route's own choices are there, so a miss is _route's to make.
                p = cmd.partition
                if p is None and (p := remembered((cmd.key, cmd.partitioner, partitions))) is None:
                    p = route(cmd, partitions)
                indexes = routed.get(p)
                if indexes is None:
                    routed[p] = [i]
                else:
                    indexes.append(i)
            else:  # this command alone is refused; the others are stored
                results[i] = m.ProduceResult(topic, -1 if cmd.partition is None else cmd.partition, error=refusal)
        for p, indexes in routed.items():
            joined = batches if len(indexes) == len(batches) else [batches[i] for i in indexes]
            answers = then(self._append_joined(fmt, topic, p, joined, first.acks, first.timeout_ms),
                           functools.partial(self._acknowledge_joined, first, p, joined))
            if isinstance(answers, defer.Deferred):
                answers = fan_out(answers.addErrback(_as_results, topic, len(indexes)), len(indexes))
            if len(indexes) == len(results):  # every command to one partition, as pipelined ones go
                return answers
            for i, answer in zip(indexes, answers, strict=True):
                results[i] = answer
        return results

    def _acknowledge_joined(self, first: m.Produce, partition: int, batches: list[m.Batch],
                            appended: tuple[int, int] | Error) -> Any:
        """The ``ProduceResult``s of ``batches`` appended together (or an ``Error``), once acknowledged."""
        topic = first.topic
        if isinstance(appended, Error):
            return [m.ProduceResult(topic, error=appended)] * len(batches)

        def result(timed_out: frozenset[int]) -> list[m.ProduceResult]:
            hw, start = self.store.high_watermark(topic, partition), self.store.log_start_offset(topic, partition)
            error = ACKS_TIMEOUT if timed_out else None
            base, n = appended[0], len(batches)
            result = m.ProduceResult
            if hw >= base + n and [batch.count for batch in batches].count(1) == n:
                # A burst of one-record produces, all below the high watermark (as acks=1 leaves
                # them): their results made in C-level passes, not a Python step each.
                offsets = range(base, base + n)
                same = itertools.repeat
                return list(map(result, same(topic, n), same(partition, n), offsets, offsets,
                                range(base + 1, base + n + 1), same(start, n), same(False, n), same(error, n)))
            out = []
            for batch in batches:  # one result per produce of a pipelined burst: kept lean
                count = batch.count
                last = base + count - 1 if count > 0 else base
                out.append(result(topic, partition, base, last, hw if hw <= last else last + 1, start, False, error))
                base = last + 1
            return out

        return self.acknowledge(first, {partition: appended[1]}, result)

    def _append_joined(self, fmt: BatchFormat, topic: str, partition: int, batches: list[m.Batch],
                       acks: m.Acks, timeout_ms: int | None) -> Any:
        """Append ``batches`` as one stored batch: ``(base, last)``, an ``Error``, or a Deferred of either
        (``acks`` and ``timeout_ms``: their produces', which a ``merged_run`` shares)."""
        try:
            self.check_leader(topic, partition)
            base = self.store.log_end_offset(topic, partition)
            payloads = [b.payload for b in batches]
            if self.compressed is not _as_compressed and is_compressing(fmt):
                payloads = [self.compressed(fmt, payload, topic) for payload in payloads]
            count = sum([b.count if b.count > 0 else 1 for b in batches])
            max_timestamp = max(-1, max([b.max_timestamp for b in batches]))
            payload = self.numbered(fmt, payloads[0] if len(payloads) == 1 else fmt.join(payloads), base,
                                    topic, partition)
            appended = self.store.append(topic, partition, fmt.name, payload, count, max_timestamp, None, acks,
                                         None, timeout_ms)
        except CommandError as e:
            return e.error
        if isinstance(appended, defer.Deferred):
            return appended.addErrback(m.error_of)
        return appended

    # ------------------------------------------------------------------ acks

    def acknowledge(self, cmd: m.Produce, lasts: dict[int, int],
                    result: Callable[[frozenset[int]], Any]) -> Any:
        """``result(partitions that timed out)`` once the writes are durable and then ``cmd.acks``
        holds for the offsets up to ``lasts[partition]`` (at once but for acks=all). Durable first:
        under the fsync policy ``always`` the high watermark passes a record only once fsynced."""
        if not lasts:  # nothing was appended: nothing to wait for
            return result(frozenset())
        if cmd.acks != m.Acks.ALL:
            return self.broker.when_durable(lambda: result(frozenset()))
        timeout_ms = cmd.timeout_ms if cmd.timeout_ms is not None else self.broker.config.ack_timeout_ms

        def replicated() -> Any:
            try:
                at_once = all(self._in_sync(cmd.topic, p, last) for p, last in lasts.items())
            except CommandError:
                at_once = False  # the wait answers it
            if at_once:
                return result(frozenset())  # the usual case, one replica or followers caught up: no wait
            waits = [self._await_replication(cmd.topic, p, last, timeout_ms) for p, last in lasts.items()]
            d = waits[0].addCallback(lambda ok: [ok]) if len(waits) == 1 else defer.gatherResults(
                waits, consumeErrors=True).addErrback(first_failure)
            return d.addCallback(lambda oks: result(frozenset(p for p, ok in zip(lasts, oks, strict=True) if not ok)))

        return self.broker.when_durable(replicated, lambda: result(frozenset()))

    def _in_sync(self, topic: str, partition: int, last: int) -> bool:
        """Whether the high watermark is past ``last`` with enough replicas in sync; raises
        ``CommandError`` when the partition cannot tell."""
        return self.store.high_watermark(topic, partition) > last and self._enough_replicas(topic, partition)

    def _await_replication(self, topic: str, partition: int, last: int, timeout_ms: int) -> defer.Deferred:
        """Fire True once the high watermark passes ``last`` with enough
        replicas in sync, False after ``timeout_ms``."""
        store = self.store
        d: defer.Deferred = defer.Deferred()
        state: dict[str, Any] = {}

        def check() -> None:
            try:
                ok = self._in_sync(topic, partition, last)
            except CommandError:
                ok = False
                finish(False)
                return
            if ok:
                finish(True)
            else:
                state["cancel"] = store.wait_for_data(topic, partition, check)

        def finish(ok: bool) -> None:
            if d.called:
                return
            if state.get("cancel"):
                state["cancel"]()
            timer = state.get("timer")
            if timer and timer.active():
                timer.cancel()
            state.clear()  # the timer's call and this closure held each other: no cycle left to collect
            d.callback(ok)

        state["timer"] = self.broker.reactor.callLater(timeout_ms / 1000, lambda: finish(False))
        check()
        return d


def shielded(d: defer.Deferred) -> defer.Deferred:
    """A Deferred of ``d``'s result whose cancelling leaves ``d`` to finish."""
    out: defer.Deferred = defer.Deferred()

    def forward(result: Any) -> None:
        if not out.called:
            (out.errback if isinstance(result, Failure) else out.callback)(result)

    d.addBoth(forward)
    return out


def _as_results(f: Failure, topic: str, count: int) -> list[m.ProduceResult]:
    """A ``CommandError`` failure as ``count`` failed ``ProduceResult``s (other failures pass)."""
    return [m.ProduceResult(topic, error=command_error(f).error)] * count


def refused(fmt: BatchFormat, batch: m.Batch) -> Error | None:
    """Why ``batch`` may not be stored, or None: its format's ``validate`` refused the
    payload, or the payload holds another number of offsets than the batch declares.

    Every produced batch passes here (or, in a burst, through ``validate_each`` and
    ``refusal_of``) before it is stored, so that no conversion
    ever meets a batch that lies about its records or inflates past its limit.
    """
    try:
        checked = fmt.validate(batch.payload)
    except CommandError as e:
        return e.error
    return refusal_of(checked, batch)


def refusal_of(checked: Validated | Error, batch: m.Batch) -> Error | None:
    """``refused`` of ``batch``, from what its format's ``validate`` (or ``validate_each``) made of it."""
    if isinstance(checked, Error):
        return checked
    if checked.span != batch.count:
        return Error(ErrorCode.CORRUPT_MESSAGE, f"batch declares {batch.count} offsets, holds {checked.span}")
    return None


def keyless_refused(topic: str, partition: int, missing: tuple[int, ...]) -> m.ProduceResult:
    """The refusal of a batch with records ``missing`` a key, for compacted ``topic`` (Kafka's
    ``INVALID_RECORD``, naming those records)."""
    return m.ProduceResult(topic, partition, error=Error(
        ErrorCode.INVALID_RECORD, f"compacted topic {topic} cannot accept a record without a key"),
        invalid_records=missing)


def _as_produced(fmt: BatchFormat, payload: bytes, base: int, topic: str, partition: int) -> bytes:
    """``numbered`` for a store that ``assigns_offsets``: the payload as produced."""
    return payload


def _as_compressed(fmt: BatchFormat, payload: bytes, topic: str) -> bytes:
    """``compressed`` for a store that ``compresses``: the payload as produced."""
    return payload


def _no_replicas_to_wait_for(topic: str, partition: int) -> bool:
    """``enough_replicas`` of a store that replicates by itself: what its high watermark passed,
    its replicas hold."""
    return True
