"""What the MQTT connections of one gateway share, and what outlives them: the plugin's
gateway-wide task (``CodecPlugin.background``, one for the ``mqtt`` and ``mqtt-ws`` listeners).

* **Client identifiers.** Each connected client identifier is held by one connection
  (``claim``): a CONNECT with the identifier of a connected client takes it over, as 3.1.4-3
  asks and Mosquitto does (``handlers``: the earlier connection gets DISCONNECT 0x8E, MQTT 5, and
  is closed; the session goes on on the new one). Across the gateways of a cluster (and
  the same in local mode): each CONNECT first writes a record to the compacted log topic
  ``topics.CLIENTS_TOPIC`` (key: the client identifier; value: the connection's name, this
  gateway's ``instance`` and a number), and answers only once it is stored (``announce``).
  Every gateway follows that topic (``follow``: a read that waits up to ``FOLLOW_WAIT_MS`` for
  the next record, so nothing is asked while nothing changes, and a record is seen as soon as it
  is stored): a connection held here
  whose client identifier has a later record naming another connection is taken over, without
  its last commit (the session goes on elsewhere from what was committed: deliveries not yet
  committed come again, at least once). Memory: the position in the topic only; records: one
  per client identifier with a session once compacted: a client that leaves none behind, and a
  session swept, get a tombstone (``leave``).
* **Delayed wills** (MQTT 5 Will Delay Interval, 3.1.3.2.2): the will of a connection that ended
  is published once its delay is over (``delay_will``), unless a connection with the same
  client identifier came first and continues the session (``take_will``). A delayed will is
  written to the compacted log topic ``topics.WILLS_TOPIC`` (key: the client identifier; value:
  its due time, the client's principal and address, its messages), which every gateway follows
  from its start, so that it outlives the gateway that held it. When it is due (or its client
  returns), a gateway writes a *claim* (to publish it) or a *cancel* (its session went on): the
  first one after the will in the topic settles it, so one gateway alone publishes it, once,
  and then writes its tombstone. A will whose write failed is kept in memory, as before.
* **Log topics as they are created**: a PUBLISH stored in a log topic no PUBLISH through this
  gateway was stored in before (``stored``) has the subscriptions waiting for that log topic (or
  for any new one) look at once, rather than at their next poll: a subscriber of a topic that did
  not exist gets its first message as soon as a publisher here created it. (The polls stay, for
  log topics created otherwise: by another protocol, an admin, another gateway.)
* **The sweep of persistent sessions that never return**: every gateway follows the records of
  the persistent sessions (``topics.SESSIONS_TOPIC``, ``session``) from its start, and keeps when
  each client now away left (memory: two numbers per session whose client is away). Every
  ``session_sweep_ms``, the sessions whose client left longer ago than the session's expiry, and
  is not connected here, end: their groups (``session.GROUP_PREFIX``) are deleted, their
  committed positions with them, and their records get tombstones. This needs no listing of
  the store's groups, and sweeps the sessions left before a restart too.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from gateway import model as m
from gateway.codec import CodecConnection, Handled, ListenerSettings, RunFor, Timer
from gateway.codec.framing import LengthPrefixedFramer, varint_header

from . import format as fmt
from . import session, topics

if TYPE_CHECKING:
    from .codec import MqttConnection

SWEPT_AT_ONCE = 256
"""The most sessions one round of a sweep ends (the rest: the next rounds)."""
MAX_STORED_TO = 4096
"""The most log topics ``Clients.stored_to`` holds; past them it starts again (each log topic is then
announced once more: ``stored``)."""
FOLLOW_WAIT_MS = 10_000
"""How long one read of a followed topic (``topics.CLIENTS_TOPIC``, ``topics.WILLS_TOPIC``,
``topics.SESSIONS_TOPIC``) waits for a record (then the next read starts)."""
FOLLOW_RETRY_S = 1.0
"""How long a gateway waits before reading a followed topic again after a read failed."""
FOLLOW_BYTES = 1 << 20
"""The most bytes of a followed topic one read takes (the rest: the next reads)."""
ENSURE = {**{name: m.CreateTopic(name, 1, m.TopicConfig(cleanup_policy="compact"), if_not_exists=True)
             for name in (topics.CLIENTS_TOPIC, topics.WILLS_TOPIC)}, topics.SESSIONS_TOPIC: session.ENSURE_SESSIONS}
WILL, CLAIM, CANCEL = b"W", b"C", b"X"
"""The first byte of a record's value in ``topics.WILLS_TOPIC``: a will, a claim to publish it, a cancel."""


def _nothing(results: Sequence[object]) -> bytes:
    return b""


def encode_will(due_ms: int, will: RunFor) -> bytes:
    """The value of a will's record in ``topics.WILLS_TOPIC``: ``WILL``, then JSON of its due time
    (ms since the epoch), its client's principal and address, and its ``Produce`` commands."""
    commands = [[c.topic, None if c.key is None else base64.b64encode(c.key).decode(),
                 base64.b64encode(c.batch.payload).decode(), c.batch.count, c.batch.max_timestamp, int(c.acks),
                 c.partitioner, c.auto_create] for c in will.commands]
    return WILL + json.dumps({"due": due_ms, "principal": will.caller.principal, "host": will.caller.host,
                              "commands": commands}).encode()


def decode_will(value: bytes) -> tuple[int, RunFor]:
    """``encode_will``'s due time and will; raises ``ValueError`` (or ``KeyError``) for another value."""
    held = json.loads(value[len(WILL):])
    commands = tuple(m.Produce(topic, None, m.Batch(fmt.NAME, base64.b64decode(payload), count, max_ts),
                               m.Acks(acks), None, None if key is None else base64.b64decode(key), partitioner,
                               auto_create)
                     for topic, key, payload, count, max_ts, acks, partitioner, auto_create in held["commands"])
    return int(held["due"]), RunFor(commands, m.Caller(held["principal"], held["host"]))


@attrs.define(eq=False)
class PendingWill:
    """A will read from ``topics.WILLS_TOPIC`` that no claim or cancel settled yet."""

    offset: int  # its record's
    will: RunFor
    claimed: bool = False  # this gateway is writing, or wrote, a claim or cancel for it
    mine: int | None = None  # the offset of that claim or cancel, once written
    first: tuple[int, bool] | None = None  # the first claim (True) or cancel read after the will


class Clients(CodecConnection):
    """The connected client identifiers, the delayed wills, the sweep (module docstring)."""

    def __init__(self, settings: ListenerSettings):
        super().__init__(settings, LengthPrefixedFramer(varint_header(1, 4), 0))  # it receives no bytes
        self.holders: dict[str, MqttConnection] = {}  # client identifier -> its connection
        self.wills: dict[str, RunFor] = {}  # client identifier -> its delayed will, held here only (not written)
        self.pending: dict[str, PendingWill] = {}  # client identifier -> its will in ``topics.WILLS_TOPIC``
        # client identifier -> a will written here, not read back yet, and what its client's return
        # decided meanwhile (None: it did not return)
        self.unread: dict[str, bool | None] = {}
        self.stored_to: set[str] = set()  # log topics PUBLISHes through this gateway were stored in
        self.sweep_every_s = settings.options["session_sweep_ms"] / 1000
        self.default_expiry_s = settings.options["session_expiry_s"]
        self.emit(Timer(self.sweep_every_s, "sweep"))
        self.instance = uuid.uuid4().hex[:16]  # this gateway run, in the names of its connections
        self.numbers = itertools.count()
        self.away: dict[str, tuple[int, int | None]] = {}  # client identifier -> when it left a session, its expiry
        # the next offset of each followed topic to read (None: its start); the client identifiers'
        # from their end, the wills' and the sessions' whole
        self.positions: dict[str, int | None] = {topics.CLIENTS_TOPIC: None, topics.WILLS_TOPIC: None,
                                                 topics.SESSIONS_TOPIC: None}
        self.readers = {topics.CLIENTS_TOPIC: self._client_read, topics.WILLS_TOPIC: self._will_read,
                        topics.SESSIONS_TOPIC: self._session_read}
        self.created = False  # whether ``topics.CLIENTS_TOPIC`` is known to be there (``announce``)
        self.emit(Handled.run((*ENSURE.values(), m.ListOffsets(topics.CLIENTS_TOPIC, 0, m.OffsetSpec.LATEST)),
                              self._started, ordered=False))

    # ------------------------------------------------------------------ client identifiers

    def claim(self, conn: MqttConnection) -> MqttConnection | None:
        """``conn`` holds its client identifier from now on; the connection that held it before,
        still open, is returned (to be taken over)."""
        before = self.holders.get(conn.client_id)
        self.holders[conn.client_id] = conn
        return before if before is not None and before is not conn and not before.closed else None

    def announce(self, conn: MqttConnection, clean_start: bool) -> m.Produce:
        """The record naming ``conn`` (from now on ``conn.held_as``) the holder of its client
        identifier, cluster-wide, and whether it starts clean (the session taken over ends, its
        will is published); once stored, its offset goes to ``conn.held_from``. Until ``created``,
        the topic's creation (``ENSURE``) must be answered first: a CONNECT may come before the
        start's creation was (in cluster mode the cluster answers it), and its record would be
        refused."""
        conn.held_as = f"{self.instance}.{next(self.numbers)}"
        return session.keyed_record(topics.CLIENTS_TOPIC, conn.client_id, f"{conn.held_as} {int(clean_start)}".encode("ascii"))

    def release(self, conn: MqttConnection) -> None:
        """``conn`` ended: its client identifier is free, unless another connection took it."""
        if self.holders.get(conn.client_id) is conn:
            del self.holders[conn.client_id]

    def leave(self, conn: MqttConnection) -> tuple[m.Produce, ...]:
        """``conn`` ended (``release``): if it held its client identifier and leaves no session
        behind, the tombstone of the identifier's record, so that compaction keeps no record of
        a client that is gone (a session left behind gets its tombstone when it is swept)."""
        held = self.holders.get(conn.client_id) is conn
        self.release(conn)
        return (session.keyed_record(topics.CLIENTS_TOPIC, conn.client_id, None),) if held and conn.held_as and conn.session_group is None else ()

    def _started(self, results: Sequence[Any]) -> bytes:
        """Follow ``topics.CLIENTS_TOPIC`` from its end, ``topics.WILLS_TOPIC`` and
        ``topics.SESSIONS_TOPIC`` from their start, as this gateway starts."""
        self.created = results[0].error is None  # (``ENSURE``'s first: ``topics.CLIENTS_TOPIC``)
        listed = results[-1]
        if listed.error is None:
            self.positions[topics.CLIENTS_TOPIC] = listed.offset
        for topic in self.positions:
            self._follow(topic)
        return b""

    def _follow(self, topic: str) -> None:
        """Read ``topic`` on from its position, waiting for its next record."""
        position = self.positions[topic]
        fetch = m.Fetch(topic, 0, m.OffsetSpec.EARLIEST if position is None else position, fmt.NAME,
                        max_bytes=FOLLOW_BYTES, max_wait_ms=FOLLOW_WAIT_MS)
        self.emit(Handled.run((fetch,), lambda results: self._followed(topic, results), ordered=False))

    def _followed(self, topic: str, results: Sequence[m.FetchResult]) -> bytes:
        """Hand each record read to the topic's reader (``readers``); then read on at once (after
        ``FOLLOW_RETRY_S`` if the read failed)."""
        result = results[0]
        if result.error is not None:  # (the topic may be missing: its creation failed at start)
            self.emit(Timer(FOLLOW_RETRY_S, ("follow", topic)))
            self.emit(Handled.run((ENSURE[topic],), _nothing, ordered=False))
            return b""
        if topic == topics.CLIENTS_TOPIC:
            self.created = True
        read = self.readers[topic]
        for batch in result.batches:
            for record in fmt.FORMAT.records(batch):
                if record.offset is not None and record.key is not None:
                    read(record.offset, record.key.decode("utf-8", "replace"), record.value)
            self.positions[topic] = batch.last_offset + 1
        self._follow(topic)  # from past what was read
        return b""

    def _client_read(self, offset: int, client_id: str, value: bytes | None) -> None:
        """Take over the connection held here for ``client_id`` if the record names another one."""
        holder = self.holders.get(client_id)
        if holder is not None and value is not None:  # (a tombstone: a client that left)
            name, _, clean = value.decode("ascii", "replace").partition(" ")
            holder.claimed_since = (offset, name, clean == "1")
            self.settle(holder)

    def settle(self, conn: MqttConnection) -> None:
        """``conn`` is taken over if the latest record read for its client identifier
        (``conn.claimed_since``) names another connection and came after ``conn``'s own (kept
        until that one is stored: ``conn.held_from``)."""
        if conn.claimed_since is None or conn.held_from is None or conn.closed:
            return
        offset, name, clean_start = conn.claimed_since
        if offset > conn.held_from and name != conn.held_as and self.holders.get(conn.client_id) is conn:
            self.release(conn)
            conn.take_over(clean_start)  # its last commit is dropped: see above

    # ------------------------------------------------------------------ persistent sessions

    def keep(self, save: session.Save, caller: m.Caller) -> None:
        """The last save of a session whose connection ended (``MqttConnection.connection_lost``):
        its record written here, then the commit that names it run for ``caller``, the client."""
        def written(results: Sequence[m.ProduceResult]) -> bytes:
            self.emit(RunFor((save.commit_after(results[0]),), caller))
            return b""

        self.emit(Handled.run((save.record(),), written, ordered=False))
        self.settings.wake()

    def _session_read(self, offset: int, client_id: str, value: bytes | None) -> None:
        """A record of ``topics.SESSIONS_TOPIC``: whether, and since when, its client is away."""
        kept = None if value is None else session.Session.decode(value)
        if kept is None or not kept.left_ms:
            self.away.pop(client_id, None)
        else:
            self.away[client_id] = (kept.left_ms, kept.expiry_s)

    # ------------------------------------------------------------------ log topics as they are created

    def stored(self, log_topic: str) -> None:
        """A PUBLISH was stored in ``log_topic``, the first one through this gateway (it may just
        have created it): each connected client's subscriptions that wait for it look now
        (``MqttConnection.look_for``)."""
        if log_topic in self.stored_to:
            return  # announced by an earlier PUBLISH of the same run
        if len(self.stored_to) >= MAX_STORED_TO:
            self.stored_to.clear()
        self.stored_to.add(log_topic)
        for conn in self.holders.values():
            conn.look_for(log_topic)

    # ------------------------------------------------------------------ delayed wills

    def delay_will(self, client_id: str, will: RunFor, delay_s: float) -> None:
        """Publish ``will`` (for the client that left it) in ``delay_s`` seconds, unless
        ``take_will`` takes it first: written to ``topics.WILLS_TOPIC`` (then it is the follower's,
        ``_will_read``), or held here if the write fails."""
        due_ms = int((time.time() + delay_s) * 1000)
        write = session.keyed_record(topics.WILLS_TOPIC, client_id, encode_will(due_ms, will))

        def written(results: Sequence[m.ProduceResult]) -> bytes:
            if results[0].error is not None:
                decided = self.unread.pop(client_id, None)
                if decided is None:
                    self.wills[client_id] = will
                    self.emit(Timer(max(0.0, due_ms / 1000 - time.time()), ("will", client_id)))
                elif decided:
                    self.emit(will)
            return b""

        self.unread[client_id] = None
        self.emit(Handled.run((write,), written, ordered=False))
        self.settings.wake()

    def take_will(self, client_id: str, publish: bool) -> None:
        """A connection with ``client_id`` came: the will still delayed for it is published now
        if ``publish`` (its session ended), else never."""
        if client_id in self.unread:  # written, not read back yet: settled once it is
            self.unread[client_id] = publish
        if client_id in self.pending:
            self._settle_will(client_id, publish)
        will = self.wills.pop(client_id, None)
        if will is not None:
            self.emit(Timer(None, ("will", client_id)))
            if publish:
                self.emit(will)
            self.settings.wake()

    def _will_read(self, offset: int, client_id: str, value: bytes | None) -> None:
        """A record of ``topics.WILLS_TOPIC``: a will waits for its time (``Timer``); the first
        claim or cancel after it settles it (``_resolve``); a tombstone ends it."""
        if value is not None and value[:1] == WILL:
            decided = self.unread.pop(client_id, None)
            try:
                due_ms, will = decode_will(value)
            except (ValueError, KeyError, TypeError):
                return  # not a will a gateway wrote: nothing to publish
            self.pending[client_id] = PendingWill(offset, will)
            self.emit(Timer(max(0.0, due_ms / 1000 - time.time()), ("will", client_id, offset)))
            if decided is not None:  # its client came back before it was read
                self._settle_will(client_id, decided)
            return
        pending = self.pending.get(client_id)
        if pending is None or offset < pending.offset:
            return
        if value is None:
            del self.pending[client_id]
        elif pending.first is None:
            pending.first = (offset, value[:1] == CLAIM)
            self._resolve(client_id)

    def _settle_will(self, client_id: str, publish: bool) -> None:
        """Write a claim (``publish``) or a cancel of ``client_id``'s pending will, once per gateway;
        ``_resolve`` tells whether it came first."""
        pending = self.pending[client_id]
        if pending.claimed or pending.first is not None:
            return
        pending.claimed = True

        def written(results: Sequence[m.ProduceResult]) -> bytes:
            if results[0].error is None:
                pending.mine = results[0].base_offset
            else:
                pending.claimed = False  # (its due time passed, or its client returned: another gateway's)
            if self.pending.get(client_id) is pending:
                self._resolve(client_id)
            return b""

        value = (CLAIM if publish else CANCEL) + self.instance.encode()
        self.emit(Handled.run((session.keyed_record(topics.WILLS_TOPIC, client_id, value),), written, ordered=False))
        self.settings.wake()

    def _resolve(self, client_id: str) -> None:
        """Once the first claim or cancel after ``client_id``'s pending will is read, and this
        gateway's own (if it wrote one) is answered: the will is done, published here if that first
        record is this gateway's claim (then its tombstone is written)."""
        pending = self.pending[client_id]
        if pending.first is None or (pending.claimed and pending.mine is None):
            return
        del self.pending[client_id]
        offset, claim = pending.first
        if claim and pending.mine == offset:
            self.emit(pending.will)
            self.emit(Handled.run((session.keyed_record(topics.WILLS_TOPIC, client_id, None),), _nothing, ordered=False))
            self.settings.wake()

    # ------------------------------------------------------------------ the sweep

    def timer(self, context: Any) -> None:
        if type(context) is tuple and context[0] == "will":  # its delay is over
            if len(context) == 3:  # ("will", client identifier, offset): a will in the topic
                pending = self.pending.get(context[1])
                if pending is not None and pending.offset == context[2]:
                    self._settle_will(context[1], True)
                return
            will = self.wills.pop(context[1], None)  # ("will", client identifier): held here
            if will is not None:
                self.emit(will)
        elif type(context) is tuple:  # ("follow", topic)
            self._follow(context[1])
        elif context == "sweep":  # the next one is set now: a round that fails leaves no gap
            self.emit(Timer(self.sweep_every_s, "sweep"))
            self._sweep(time.time() * 1000)
        else:
            super().timer(context)

    def _sweep(self, now_ms: float) -> None:
        """End the sessions past their expiry whose client is not connected here (module docstring)."""
        ended = []
        for client_id, (left_ms, expiry_s) in self.away.items():
            if client_id not in self.holders and \
                    now_ms - left_ms >= (self.default_expiry_s if expiry_s is None else expiry_s) * 1000:
                ended.append(client_id)
                if len(ended) == SWEPT_AT_ONCE:
                    break
        if not ended:
            return
        for client_id in ended:
            del self.away[client_id]
        tombstones = tuple(session.keyed_record(topic, client_id, None) for client_id in ended
                           for topic in (topics.SESSIONS_TOPIC, topics.CLIENTS_TOPIC))
        self.emit(Handled.run((m.DeleteGroups(tuple(session.group_of(c) for c in ended)), *tombstones), _nothing,
                              ordered=False))
