"""Reading: fetches, long-polls that wait for data, and offset look-ups.

Transactions (``gateway.broker.transactions``) decide what a read may return:
a ``read_committed`` fetch stops at the partition's last stable offset; a
reader of the transactional format (Kafka) gets the aborted transactions of
its range and skips them itself, any other reader gets neither markers nor
aborted records (``_visible``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import attrs
from twisted.internet import defer
from twisted.python.failure import Failure

from gateway import model as m
from gateway.broker.calls import errors_as, refusal, then, unknown_leader_epoch
from gateway.codec.formats import is_transactional
from gateway.convert import convert
from gateway.model import CommandError, Error, ErrorCode
from gateway.storage.interface import LeaderEpochStorage, MayWait

if TYPE_CHECKING:
    from gateway.broker import Broker


class Fetcher:
    def __init__(self, broker: Broker):
        self.broker = broker
        self.store = store = broker.store
        self._leader_epoch: Callable[[str, int], int]
        self._end_offset_for_leader_epoch: Callable[[str, int, int], tuple[int, int]]
        if store.leader_epochs:
            epochs = cast(LeaderEpochStorage, store)
            self._leader_epoch, self._end_offset_for_leader_epoch = epochs.leader_epoch, epochs.end_offset_for_leader_epoch
        else:  # no epoch to check a client's against, none to look up
            self._leader_epoch = unknown_leader_epoch
            self._end_offset_for_leader_epoch = refusal(store, "end_offset_for_leader_epoch")

    def _start_offset(self, cmd: m.Fetch) -> Any:
        """The offset ``cmd`` starts at (or a Deferred of it): the group's commit, else
        its offset with EARLIEST/LATEST resolved. Raises for an unknown partition."""
        if cmd.group is not None:
            return then(self.store.committed_offset(cmd.group, cmd.topic, cmd.partition),
                        lambda committed: committed if committed is not None and committed >= 0
                        else self._given_offset(cmd))
        return self._given_offset(cmd)

    def _given_offset(self, cmd: m.Fetch) -> Any:
        if cmd.offset == m.OffsetSpec.EARLIEST:
            return self.store.log_start_offset(cmd.topic, cmd.partition)
        if cmd.offset == m.OffsetSpec.LATEST:
            hw = self.store.high_watermark(cmd.topic, cmd.partition)
            return self.broker.transactions.stable_offset(cmd.topic, cmd.partition, hw) \
                if cmd.read_committed else hw
        return cmd.offset

    def _read(self, cmd: m.Fetch, max_bytes: int | None = None, refreshed: bool = False,
              skipped_from: int | None = None) -> Any:
        """Read now, without waiting for new data: the ``FetchResult`` (or a Deferred
        of it); errors come back in the result. An offset past the watermarks
        is out of range only once they were refreshed (``refresh_watermarks``).
        A read whose batches a reader may not see (markers, aborted records)
        reads on after them (``skipped_from``: where the first read started)."""
        store = self.store
        try:
            hw = store.high_watermark(cmd.topic, cmd.partition)
            start = store.log_start_offset(cmd.topic, cmd.partition)
            end = store.log_end_offset(cmd.topic, cmd.partition)
            offset = self._start_offset(cmd)
            tid = store.topic_id(cmd.topic)
            if cmd.leader_epoch >= 0:
                self._check_leader_epoch(cmd.topic, cmd.partition, cmd.leader_epoch)
            if offset > max(hw, end) and not refreshed:
                waited = store.refresh_watermarks(cmd.topic, cmd.partition)
                if waited is not None:
                    return waited.addCallback(lambda _: self._read(cmd, max_bytes, True))
        except CommandError as e:
            return m.FetchResult(cmd.topic, cmd.partition, error=e.error, offset=cmd.offset)
        if offset < start or offset > max(hw, end):
            return m.FetchResult(cmd.topic, cmd.partition, hw, start, hw, offset=offset,
                                 error=Error(ErrorCode.OFFSET_OUT_OF_RANGE,
                                             f"offset {offset} is outside [{start}, {hw}]"))
        limit = cmd.max_bytes if max_bytes is None else min(max_bytes, cmd.max_bytes)
        if limit <= 0:
            return self._converted(cmd, [], hw, start, offset, tid)
        try:
            stored = store.read(cmd.topic, cmd.partition, offset, limit, cmd.read_committed)
        except CommandError as e:
            return m.FetchResult(cmd.topic, cmd.partition, hw, start, hw, offset=offset, error=e.error)
        if isinstance(stored, defer.Deferred):
            def failed(f: Any) -> m.FetchResult:
                f.trap(CommandError)
                return m.FetchResult(cmd.topic, cmd.partition, hw, start, hw, offset=offset, error=f.value.error)

            def read(s: list[m.StoredBatch]) -> m.FetchResult:
                try:  # the read waited: the watermarks may have moved meanwhile
                    now_hw = store.high_watermark(cmd.topic, cmd.partition)
                    now_start = store.log_start_offset(cmd.topic, cmd.partition)
                except CommandError as e:
                    return m.FetchResult(cmd.topic, cmd.partition, hw, start, hw, offset=offset, error=e.error)
                return self._visible(cmd, s, now_hw, now_start, offset, tid, max_bytes, skipped_from)

            return stored.addCallbacks(read, failed)
        return self._visible(cmd, stored, hw, start, offset, tid, max_bytes, skipped_from)

    def _visible(self, cmd: m.Fetch, stored: list[m.StoredBatch], hw: int, start: int, offset: int, tid: str,
                 max_bytes: int | None, skipped_from: int | None) -> Any:
        """The ``FetchResult`` of what the reader may see of ``stored``, converted to its format.

        Without transactions on the partition this costs a comparison: the last stable offset
        is the high watermark and nothing was aborted. A reader of another format than a
        transactional batch's is never given markers or aborted records (checked per batch,
        beside the conversion such a batch needs anyway)."""
        txns = self.broker.transactions
        lso = txns.last_stable_offset(cmd.topic, cmd.partition, hw)
        aborted: tuple[tuple[int, int], ...] = ()
        if cmd.read_committed and stored:
            if lso < hw:
                stored = [b for b in stored if b.base_offset < lso]
            fmt = cmd.format
            if any(b.format != fmt for b in stored):
                visible = [b for b in stored if b.format == fmt or not self._hidden(cmd, b)]
                if stored and not visible:  # only markers or aborted records: read on after them
                    after = stored[-1].last_offset + 1
                    return self._read(attrs.evolve(cmd, offset=after, group=None), max_bytes, True,
                                      offset if skipped_from is None else skipped_from)
                stored = visible
            if stored and txns.has_aborted(cmd.topic, cmd.partition):  # the reader skips those of its format
                aborted = txns.aborted_between(cmd.topic, cmd.partition, offset,
                                               stored[-1].last_offset + 1)
        result = self._converted(cmd, stored, hw, start, offset if skipped_from is None else skipped_from, tid)
        if result.error is None and (lso != hw or aborted):
            # a reader without isolation levels is told the end of what it may read as the high watermark
            told = lso if cmd.read_committed and not self._transactional(cmd.format) else hw
            return attrs.evolve(result, high_watermark=told, last_stable_offset=lso, aborted=aborted)
        return result

    def _transactional(self, name: str) -> bool:
        fmt = self.broker.formats.get(name)
        return fmt is not None and is_transactional(fmt)

    def _hidden(self, cmd: m.Fetch, batch: m.StoredBatch) -> bool:
        """Whether a reader of another format may not see ``batch``: a marker, or aborted records."""
        fmt = self.broker.formats.get(batch.format)
        if fmt is None or not is_transactional(fmt):
            return False
        producer = fmt.batch_producer(batch.payload)
        return producer.control or (producer.transactional and self.broker.transactions.is_aborted(
            cmd.topic, cmd.partition, producer.producer_id, batch.base_offset))

    def _converted(self, cmd: m.Fetch, stored: list[m.StoredBatch], hw: int, start: int, offset: int,
                   tid: str) -> m.FetchResult:
        broker = self.broker
        cache = broker.cache
        try:
            batches = tuple(convert(stored, cmd.format, broker.formats, cache, (tid, cmd.partition)))
        except CommandError as e:
            return m.FetchResult(cmd.topic, cmd.partition, hw, start, hw, offset=offset, error=e.error)
        finally:
            if cache.done:  # runs converted (not found in the cache): counted by format pair
                broker.stats.converted(stored, cache.take())
        return m.FetchResult(cmd.topic, cmd.partition, hw, start, hw, batches, offset=offset)

    def _read_many(self, cmd: m.FetchMany) -> Any:
        """Read each fetch in turn within ``cmd.max_bytes`` (the first data always
        fits): the results, or a Deferred of them when a read waits."""
        return self._read_from(cmd, 0, [], cmd.max_bytes)

    def _read_from(self, cmd: m.FetchMany, index: int, out: list[m.FetchResult], budget: int) -> Any:
        """``_read_many`` from ``cmd.fetches[index]`` on, with ``out`` read so far and
        ``budget`` bytes left.

        A method rather than a closure that calls itself: such a closure is a reference
        cycle, and would keep what it read (a fetch's batches, a megabyte each) alive until
        the garbage collector next ran, which a gateway serving large fetches seldom makes
        it do. Memory then grew by what consumers read.
        """
        for i in range(index, len(cmd.fetches)):
            first = not any(o.batches for o in out)
            r = self._read(cmd.fetches[i], max(budget, 1) if first else budget)
            if isinstance(r, defer.Deferred):
                return r.addCallback(self._read_on, cmd, i, out, budget)
            r = _within(r, budget, first)
            out.append(r)
            budget -= r.size
        return tuple(out)

    def _read_on(self, r: m.FetchResult, cmd: m.FetchMany, index: int, out: list[m.FetchResult],
                 budget: int) -> Any:
        """``_read_from`` after the read of ``cmd.fetches[index]`` that waited gave ``r``."""
        r = _within(r, budget, not any(o.batches for o in out))
        out.append(r)
        return self._read_from(cmd, index + 1, out, budget - r.size)

    def fetch(self, cmd: m.Fetch) -> MayWait[m.FetchResult]:
        many = m.FetchMany((cmd,), cmd.max_wait_ms, cmd.min_bytes, cmd.max_bytes)
        return then(self.fetch_many(many), lambda r: r.results[0])

    def fetch_many(self, cmd: m.FetchMany) -> MayWait[m.FetchManyResult]:
        """Answer at once if there is ``min_bytes`` of data (or an error, or no
        wait asked); otherwise when an append brings enough, or at the timeout."""
        # Resolve EARLIEST/LATEST/group offsets once, so that waiting for "latest"
        # waits for records appended after the request arrived.
        fetches: list[Any] = []
        for f in cmd.fetches:
            try:
                offset = self._start_offset(f)
            except CommandError:
                fetches.append(f)  # its read answers with the error
                continue
            fetches.append(then(offset, functools.partial(_started_at, f)))
        waits = [f for f in fetches if isinstance(f, defer.Deferred)]
        if waits:
            for i, f in enumerate(fetches):
                if isinstance(f, defer.Deferred):
                    fetches[i] = f.addErrback(_refused_as, cmd.fetches[i])
            return defer.gatherResults(
                [f if isinstance(f, defer.Deferred) else defer.succeed(f) for f in fetches]).addCallback(
                lambda resolved: self._fetch_from(attrs.evolve(cmd, fetches=tuple(resolved))))
        return self._fetch_from(attrs.evolve(cmd, fetches=tuple(fetches)))

    def _fetch_from(self, cmd: m.FetchMany) -> Any:
        """``fetch_many`` once every start offset is resolved."""
        return then(self._read_many(cmd), lambda results: self._answer_or_wait(cmd, results))

    def _answer_or_wait(self, cmd: m.FetchMany, results: tuple[m.FetchResult, ...]) -> Any:
        def enough(rs: tuple[m.FetchResult, ...]) -> bool:
            return (any(r.error for r in rs) or sum(r.size for r in rs) >= cmd.min_bytes)

        if cmd.max_wait_ms <= 0 or enough(results):
            return m.FetchManyResult(results)
        store = self.store
        state: dict[str, Any] = {"cancels": []}

        def cancel_waits() -> None:
            for c in state["cancels"]:
                c()
            state["cancels"] = []

        def wait() -> None:
            for f in cmd.fetches:
                with contextlib.suppress(CommandError):
                    state["cancels"].append(store.wait_for_data(f.topic, f.partition, changed, f.read_committed))

        def changed() -> None:
            if d.called:
                return
            cancel_waits()
            then(self._read_many(cmd), reread)

        def reread(rs: tuple[m.FetchResult, ...]) -> None:
            if d.called:
                return
            if enough(rs):
                finish(rs)
            else:
                wait()

        def finish(rs: tuple[m.FetchResult, ...] | None = None) -> None:
            cancel_waits()
            timer = state.get("timer")
            if timer and timer.active():
                timer.cancel()
            if d.called:
                return
            if rs is not None:
                d.callback(m.FetchManyResult(rs))
            else:
                then(self._read_many(cmd), deliver)

        def deliver(rs: tuple[m.FetchResult, ...]) -> None:
            if not d.called:
                d.callback(m.FetchManyResult(rs))

        d: defer.Deferred = defer.Deferred(lambda _: finish(()))
        state["timer"] = self.broker.reactor.callLater(cmd.max_wait_ms / 1000, finish)
        wait()
        return d

    def _check_leader_epoch(self, topic: str, partition: int, leader_epoch: int) -> None:
        """Raise unless ``leader_epoch`` is the partition's (or the storage keeps none)."""
        current = self._leader_epoch(topic, partition)
        if current >= 0 and leader_epoch != current:
            raise CommandError(ErrorCode.FENCED_LEADER_EPOCH if leader_epoch < current else
                               ErrorCode.UNKNOWN_LEADER_EPOCH,
                               f"leader epoch {leader_epoch}, the partition's is {current}")

    def offset_for_leader_epoch(self, cmd: m.OffsetForLeaderEpoch) -> m.OffsetForLeaderEpochResult:
        try:
            epoch, end = self._end_offset_for_leader_epoch(cmd.topic, cmd.partition, cmd.leader_epoch)
            if cmd.current_leader_epoch >= 0:
                self._check_leader_epoch(cmd.topic, cmd.partition, cmd.current_leader_epoch)
        except CommandError as e:
            return m.OffsetForLeaderEpochResult(cmd.topic, cmd.partition, error=e.error)
        return m.OffsetForLeaderEpochResult(cmd.topic, cmd.partition, epoch, end)

    @errors_as(m.ListOffsetsResult, "topic", "partition")
    def list_offsets(self, cmd: m.ListOffsets) -> MayWait[m.ListOffsetsResult]:
        store, topic, partition = self.store, cmd.topic, cmd.partition
        if cmd.timestamp == m.OffsetSpec.EARLIEST:
            return m.ListOffsetsResult(topic, partition, store.log_start_offset(topic, partition))
        if cmd.timestamp == m.OffsetSpec.LATEST:
            hw = store.high_watermark(topic, partition)
            if not cmd.read_committed:
                return m.ListOffsetsResult(topic, partition, hw)
            return then(self.broker.transactions.stable_offset(topic, partition, hw),
                        lambda lso: m.ListOffsetsResult(topic, partition, lso))
        if cmd.timestamp == m.OffsetSpec.MAX_TIMESTAMP:
            return then(store.max_timestamp_offset(topic, partition), lambda found: self._newest(cmd, *found))
        return then(store.offset_for_timestamp(topic, partition, cmd.timestamp), lambda o: self._at_time(cmd, o))

    def _newest(self, cmd: m.ListOffsets, offset: int, timestamp: int) -> MayWait[m.ListOffsetsResult]:
        """The first record with the largest timestamp, ``timestamp``, in the batch that holds
        ``offset`` (a store that keeps batches knows only the batch: Kafka answers the record)."""
        if offset < 0:
            return m.ListOffsetsResult(cmd.topic, cmd.partition, -1, -1)
        return then(self.store.read(cmd.topic, cmd.partition, offset, 1),
                    lambda stored: m.ListOffsetsResult(cmd.topic, cmd.partition, *self._first_record_at(
                        stored, stored[0].base_offset if stored else offset, timestamp)))

    def _at_time(self, cmd: m.ListOffsets, offset: int | None) -> MayWait[m.ListOffsetsResult]:
        """The first record at or after ``cmd.timestamp``, from the batch found at ``offset``."""
        store, topic, partition = self.store, cmd.topic, cmd.partition
        if offset is None or offset >= store.high_watermark(topic, partition):
            return m.ListOffsetsResult(topic, partition, -1, -1)
        offset = max(offset, store.log_start_offset(topic, partition))
        return then(store.read(topic, partition, offset, 1),
                    lambda stored: m.ListOffsetsResult(topic, partition,
                                                       *self._first_record_at(stored, offset, cmd.timestamp)))

    def _first_record_at(self, stored: list[m.StoredBatch], offset: int, timestamp: int) -> tuple[int, int]:
        """Within the batch found by the time index, the first record at or after ``timestamp``."""
        for batch in stored[:1]:
            fmt = self.broker.formats.get(batch.format)
            for record in fmt.records(batch) if fmt is not None else ():
                at = record.offset
                assert at is not None  # read from storage: numbered
                if at >= offset and record.timestamp >= timestamp:
                    return at, record.timestamp
        return offset, timestamp


def _within(r: m.FetchResult, budget: int, first: bool) -> m.FetchResult:
    """``r`` without the batches past ``budget``, but for the answer's ``first`` batch: only that one
    may pass the answer's limit (Kafka's rule, so that a consumer always progresses), and a store
    gives a read's first batch whole, however large, and may give more."""
    size = 0
    for kept, b in enumerate(r.batches):
        size += len(b.payload)
        if size > budget and not (first and kept == 0):
            return attrs.evolve(r, batches=r.batches[:kept], aborted=r.aborted if kept else ())
    return r


def _started_at(fetch: m.Fetch, offset: int) -> m.Fetch:
    """``fetch`` from the ``offset`` its group's committed offset or spec resolved to."""
    return attrs.evolve(fetch, offset=offset, group=None)


def _refused_as(failure: Failure, fetch: m.Fetch) -> m.Fetch:
    """``fetch`` itself when resolving its start failed with a ``CommandError``: its read
    answers with the error."""
    failure.trap(CommandError)
    return fetch
