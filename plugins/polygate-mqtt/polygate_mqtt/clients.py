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
  client identifier came first and continues the session (``take_will``).
* **Log topics as they are created**: a PUBLISH stored in a log topic no PUBLISH through this
  gateway was stored in before (``stored``) has the subscriptions waiting for that log topic (or
  for any new one) look at once, rather than at their next poll: a subscriber of a topic that did
  not exist gets its first message as soon as a publisher here created it. (The polls stay, for
  log topics created otherwise: by another protocol, an admin, another gateway.)
* **The sweep of persistent sessions that never return**: every ``session_sweep_ms``, the
  groups of persistent sessions (``session.GROUP_PREFIX``) whose client left longer ago than the
  session's expiry are deleted (their committed positions and subscriptions go with them), also
  those left by a gateway that has restarted since.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gateway import model as m
from gateway.codec import CodecConnection, Handled, ListenerSettings, RunFor, Timer
from gateway.codec.framing import LengthPrefixedFramer, varint_header

from . import format as fmt
from . import session, topics

if TYPE_CHECKING:
    from .codec import MqttConnection

SWEPT_AT_ONCE = 256
"""The most session groups one round of a sweep reads the anchors of (the rest: the next rounds)."""
MAX_STORED_TO = 4096
"""The most log topics ``Clients.stored_to`` holds; past them it starts again (each log topic is then
announced once more: ``stored``)."""
FOLLOW_WAIT_MS = 10_000
"""How long one read of ``topics.CLIENTS_TOPIC`` waits for a record (then the next read starts)."""
FOLLOW_RETRY_S = 1.0
"""How long a gateway waits before reading ``topics.CLIENTS_TOPIC`` again after a read failed."""
FOLLOW_BYTES = 1 << 20
"""The most bytes of ``topics.CLIENTS_TOPIC`` one look reads (the rest: the next looks)."""
ENSURE_CLIENTS = m.CreateTopic(topics.CLIENTS_TOPIC, 1, m.TopicConfig(cleanup_policy="compact"), if_not_exists=True)


def _nothing(results: Sequence[object]) -> bytes:
    return b""


def _client_record(client_id: str, value: bytes | None) -> m.Produce:
    """The record of ``client_id`` in ``topics.CLIENTS_TOPIC``: ``value`` names the connection holding
    it (``Clients.announce``), ``None`` is the tombstone of a client that left."""
    key, now = client_id.encode("utf-8"), int(time.time() * 1000)
    record = fmt.encode_record(0, now, 0, key, value, b"")
    return m.Produce(topics.CLIENTS_TOPIC, 0, m.Batch(fmt.NAME, record, 1, now), m.Acks.ALL, None, key)


class Clients(CodecConnection):
    """The connected client identifiers, the delayed wills, the sweep (module docstring)."""

    def __init__(self, settings: ListenerSettings):
        super().__init__(settings, LengthPrefixedFramer(varint_header(1, 4), 0))  # it receives no bytes
        self.holders: dict[str, MqttConnection] = {}  # client identifier -> its connection
        self.wills: dict[str, RunFor] = {}  # client identifier -> its delayed will, for its client
        self.stored_to: set[str] = set()  # log topics PUBLISHes through this gateway were stored in
        self.sweep_every_s = settings.options["session_sweep_ms"] / 1000
        self.default_expiry_s = settings.options["session_expiry_s"]
        self.emit(Timer(self.sweep_every_s, "sweep"))
        self.instance = uuid.uuid4().hex[:16]  # this gateway run, in the names of its connections
        self.numbers = itertools.count()
        self.position: int | None = None  # the next offset of ``topics.CLIENTS_TOPIC`` to read
        self.emit(Handled.run((ENSURE_CLIENTS, m.ListOffsets(topics.CLIENTS_TOPIC, 0, m.OffsetSpec.LATEST)),
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
        will is published); once stored, its offset goes to ``conn.held_from``."""
        conn.held_as = f"{self.instance}.{next(self.numbers)}"
        return _client_record(conn.client_id, f"{conn.held_as} {int(clean_start)}".encode("ascii"))

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
        return (_client_record(conn.client_id, None),) if held and conn.held_as and conn.session_group is None else ()

    def _started(self, results: Sequence[Any]) -> bytes:
        """Follow ``topics.CLIENTS_TOPIC`` from its end as this gateway starts."""
        listed = results[1]
        if listed.error is None:
            self.position = listed.offset
        self._follow()
        return b""

    def _follow(self) -> None:
        if self.position is None:  # the topic's end was not known at start: from its start
            self.position = m.OffsetSpec.EARLIEST
        fetch = m.Fetch(topics.CLIENTS_TOPIC, 0, self.position, fmt.NAME, max_bytes=FOLLOW_BYTES,
                        max_wait_ms=FOLLOW_WAIT_MS)
        self.emit(Handled.run((fetch,), self._read_claims, ordered=False))

    def _read_claims(self, results: Sequence[m.FetchResult]) -> bytes:
        """Take over the connections held here whose client identifier a later record gives to
        another connection; then read on at once (after ``FOLLOW_RETRY_S`` if the read failed)."""
        result = results[0]
        if result.error is not None:  # (the topic may be missing: its creation failed at start)
            self.emit(Timer(FOLLOW_RETRY_S, "follow"))
            self.emit(Handled.run((ENSURE_CLIENTS,), _nothing, ordered=False))
            return b""
        for batch in result.batches:
            for record in fmt.FORMAT.records(batch):
                if record.offset is None or record.key is None:
                    continue
                self.position = record.offset + 1
                holder = self.holders.get(record.key.decode("utf-8", "replace"))
                if holder is not None and record.value is not None:  # (a tombstone: a client that left)
                    name, _, clean = (record.value or b"").decode("ascii", "replace").partition(" ")
                    holder.claimed_since = (record.offset, name, clean == "1")
                    self.settle(holder)
            self.position = max(self.position or 0, batch.last_offset + 1)  # (a batch of no client's record)
        self._follow()  # from past what was read
        return b""

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
        ``take_will`` takes it first."""
        self.wills[client_id] = will
        self.emit(Timer(delay_s, ("will", client_id)))
        self.settings.wake()

    def take_will(self, client_id: str, publish: bool) -> None:
        """A connection with ``client_id`` came: the will still delayed for it is published now
        if ``publish`` (its session ended), else never."""
        will = self.wills.pop(client_id, None)
        if will is not None:
            self.emit(Timer(None, ("will", client_id)))
            if publish:
                self.emit(will)
            self.settings.wake()

    # ------------------------------------------------------------------ the sweep

    def timer(self, context: Any) -> None:
        if type(context) is tuple:  # ("will", client identifier): its delay is over
            will = self.wills.pop(context[1], None)
            if will is not None:
                self.emit(will)
        elif context == "follow":
            self._follow()
        elif context == "sweep":  # the next one is set now: a round that fails leaves no gap
            self.emit(Timer(self.sweep_every_s, "sweep"))
            self.emit(Handled.run((m.ListGroups(),), self._listed, ordered=False))
        else:
            super().timer(context)

    def _listed(self, results: Sequence[m.ListGroupsResult]) -> bytes | Handled:
        """Read the anchors of the sessions whose clients are not connected here."""
        groups = tuple(listing.group for listing in results[0].groups
                       if listing.group.startswith(session.GROUP_PREFIX)
                       and listing.group[len(session.GROUP_PREFIX):] not in self.holders)
        return self._read(groups)

    def _read(self, groups: tuple[str, ...]) -> bytes | Handled:
        if not groups:
            return b""
        now, rest = groups[:SWEPT_AT_ONCE], groups[SWEPT_AT_ONCE:]
        return Handled.run(tuple(m.FetchOffsets(group, (session.ANCHOR,)) for group in now),
                           lambda results: self._anchors(now, rest, results), ordered=False)

    def _anchors(self, groups: tuple[str, ...], rest: tuple[str, ...],
                 results: Sequence[m.FetchOffsetsResult]) -> bytes | Handled:
        """Delete the groups of the sessions past their expiry; then the next round."""
        now_ms = time.time() * 1000
        expired = []
        for group, result in zip(groups, results, strict=True):
            anchor = session.restored(result.offsets)[0] if result.error is None else None
            if anchor is not None and anchor.expired(now_ms, self.default_expiry_s) \
                    and group[len(session.GROUP_PREFIX):] not in self.holders:
                expired.append(group)
        if expired:
            gone = tuple(_client_record(group[len(session.GROUP_PREFIX):], None) for group in expired)
            self.emit(Handled.run((m.DeleteGroups(tuple(expired)), *gone), _nothing, ordered=False))
        return self._read(rest)
