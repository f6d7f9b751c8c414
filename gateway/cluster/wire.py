"""The gateway's own Kafka client of the cluster, for the data path: batches in, batches out.

librdkafka takes records, not batches: through it, every record of a batch
was decoded, handed over with its own call, batched and compressed again,
and fetched records came back one by one. This client speaks the Kafka
protocol itself, in the reactor thread, with the Kafka codec's message
definitions (``gateway.codecs.kafka.schema``, built from Apache's), so that a
record batch goes to the cluster as the bytes it is and comes back the same
way, as Kroxylicious forwards batches with Kafka's own message classes.

What it does:

- **Connections.** One connection per broker and *lane*: produce requests and
  fetch requests travel on different connections, because a broker answers
  one connection's requests in order and a fetch waits up to its
  ``max_wait``. Each connection agrees the versions with ApiVersions, then
  authenticates (SASL PLAIN or SCRAM-SHA-256/512, as ``sasl.*`` configure it;
  TLS as ``security.protocol`` and ``ssl.*`` do, with librdkafka's property
  names, which ``--cluster-option`` takes).
- **Time.** Each request has its own timeout (a produce's is its client's).
  One not answered within it fails alone with ``REQUEST_TIMED_OUT``, and its
  connection is *retired*: it takes no new request (the next one opens a new
  connection, so a stalled or restarted cluster is met with new connections,
  never a stuck one) but stays open until every request on it was answered
  or timed out (a late answer is matched by its correlation id and dropped).
  Closing it at once would fail the other requests on it while their clients
  still wait, and a produce failed that way may yet be stored by the cluster.
  At most ``RETIRING_MAX`` retired connections per broker and lane are kept
  open; past that, the oldest is closed.
- **Where partitions are.** Metadata for the topics in use, refreshed when an
  answer says a leader moved or a connection failed; and every answer to the
  gateway's picture of the whole cluster (``gateway.cluster.metadata``, every
  second), so that the data path and the broker's calls see one cluster.

It does not retry: the writer and the reader decide what may be retried.
"""

from __future__ import annotations

import functools
import logging
import struct
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from twisted.internet import defer, endpoints, protocol, ssl, task

from gateway.adapter import for_whole_frames, write_now
from gateway.cluster import shapes
from gateway.cluster.config import ClusterConfig
from gateway.codec.framing import FrameTooLarge, LengthPrefixedFramer, fixed_header
from gateway.codecs.kafka import schema
from gateway.codecs.kafka.errors import Errors
from gateway.shared import Shared

log = logging.getLogger(__name__)

PRODUCE, FETCH, METADATA, API_VERSIONS, SASL_HANDSHAKE, INIT_PRODUCER_ID, SASL_AUTHENTICATE = 0, 1, 3, 18, 17, 22, 36
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, LEAVE_GROUP, OFFSET_DELETE = 8, 9, 10, 13, 47
JOIN_GROUP, HEARTBEAT, SYNC_GROUP = 11, 12, 14
LIST_OFFSETS, DESCRIBE_CONFIGS = 2, 32
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
# The highest version of each API the client uses (Fetch 12: the last that names topics, not ids;
# Metadata 10 and up: topic ids; FindCoordinator 3: the last of one group a request; OffsetFetch 9:
# groups in a batch from v8, which ``OFFSET_FETCH_BATCHED`` names; LeaveGroup 3: the first that names
# a static member; the transaction APIs 3: the last before KIP-890, whose later versions are a
# broker's or bump epochs; JoinGroup 5, SyncGroup 3 and Heartbeat 3: the first that name a static
# member, before the flexible versions).
WANTED = {PRODUCE: 9, FETCH: 12, METADATA: 12, INIT_PRODUCER_ID: 4, SASL_HANDSHAKE: 1, SASL_AUTHENTICATE: 2,
          OFFSET_COMMIT: 8, OFFSET_FETCH: 9, FIND_COORDINATOR: 3, LEAVE_GROUP: 4, OFFSET_DELETE: 0,
          LIST_OFFSETS: 7, DESCRIBE_CONFIGS: 4, JOIN_GROUP: 5, SYNC_GROUP: 3, HEARTBEAT: 3,
          ADD_PARTITIONS_TO_TXN: 3, ADD_OFFSETS_TO_TXN: 3, END_TXN: 3, TXN_OFFSET_COMMIT: 3}
OFFSET_FETCH_BATCHED = 8
# The lowest each must reach: record batches (magic 2) need Produce 3 and Fetch 4; offsets kept by
# the cluster itself, with a member's generation, OffsetCommit 2; all of a group's, OffsetFetch 2;
# all topics (a null list), Metadata 1; one offset a partition, ListOffsets 1; a transaction's
# offsets with their leader epochs, TxnOffsetCommit 2; a rebalance timeout, JoinGroup 1.
NEEDED = {PRODUCE: 3, FETCH: 4, METADATA: 1, INIT_PRODUCER_ID: 0, SASL_HANDSHAKE: 1, SASL_AUTHENTICATE: 0,
          OFFSET_COMMIT: 2, OFFSET_FETCH: 2, FIND_COORDINATOR: 0, LEAVE_GROUP: 3, OFFSET_DELETE: 0,
          LIST_OFFSETS: 1, DESCRIBE_CONFIGS: 0, JOIN_GROUP: 1, SYNC_GROUP: 0, HEARTBEAT: 0,
          ADD_PARTITIONS_TO_TXN: 0, ADD_OFFSETS_TO_TXN: 0, END_TXN: 0, TXN_OFFSET_COMMIT: 2}
MAX_FRAME = 256 << 20
_SIZE = struct.Struct(">i")
SWEEP_S = 0.1  # how often requests are checked for their timeout, while any waits (an idle client sleeps)
CONNECT_TIMEOUT_S = 5.0
RETIRING_MAX = 4  # retired connections of one broker and lane kept open for their requests still waiting

# Errors after which the partition's leader is looked up again.
STALE_METADATA = frozenset({Errors.NOT_LEADER_OR_FOLLOWER, Errors.LEADER_NOT_AVAILABLE,
                            Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.FENCED_LEADER_EPOCH,
                            Errors.UNKNOWN_LEADER_EPOCH, Errors.NOT_CONTROLLER})


class WireError(Exception):
    """A request that failed: ``code`` is Kafka's error code (``Errors``); ``sent`` says whether the
    request may have reached the broker (a retry of a request that did may be a duplicate)."""

    def __init__(self, code: int, message: str, sent: bool = False):
        super().__init__(message)
        self.code = code
        self.sent = sent

    @property
    def name(self) -> str:
        try:
            return Errors(self.code).name
        except ValueError:
            return f"error {self.code}"


def not_sent(f: Any) -> Any:
    """The errback of a step before a request is written (finding the leader, opening a
    connection): its ``WireError`` said ``sent`` of a request of its own, but the broker never saw
    the one that was to follow."""
    if f.check(WireError) and f.value.sent:
        raise WireError(f.value.code, str(f.value), sent=False)
    return f


def at_leader(client: ClusterClient, topic: str, partition: int,
              send: Callable[[PartitionLeader], defer.Deferred]) -> defer.Deferred:
    """``send(leader)`` once ``client`` knows the partition's leader (at once, or after a lookup). A
    failed lookup fails with its ``WireError`` marked not sent (``not_sent``)."""
    found = client.leader(topic, partition)
    return send(found) if not isinstance(found, defer.Deferred) else found.addCallbacks(send, not_sent)


@attrs.define
class _Pending:
    decode: Callable[[bytes | bytearray], Any]  # the answer's frame (correlation id first) -> its body
    deferred: defer.Deferred
    deadline: float


def _by_schema(api_key: int, version: int, data: bytes | bytearray) -> Any:
    """The body of an answer to ``api_key`` at ``version``, read by the codec's schema."""
    message = schema.MESSAGES[api_key]
    _, at = schema.parse(schema.response_header(api_key, message.flexible(version)), data)
    body, _ = schema.parse(message.response(version), data, at)
    return body


class BrokerConnection(protocol.Protocol):
    """One connection to one broker: requests out, answers matched by correlation id, in order.

    Answers are framed by the codec toolkit's framer, which gathers a large answer (a fetch's
    megabytes) from the pieces received and joins it once."""

    transport: Any  # a TCP or TLS transport: abortConnection too

    def __init__(self, clock: Any, client_id: str):
        self.framer = LengthPrefixedFramer(fixed_header(_SIZE, 0), MAX_FRAME)
        self.clock = clock
        self.client_id = client_id
        self._client_id = client_id.encode()
        self.pending: dict[int, _Pending] = {}
        self.correlation = 0
        self.versions: dict[int, int] = {}  # api key -> the version used with this broker
        self.closed = False
        self.retired = False  # a request on it timed out: it takes no new one, and closes once none waits
        self.label = "?"

    def connectionMade(self) -> None:  # noqa: N802 - Twisted's name
        for_whole_frames(self.transport)  # (an EndTxn must not wait behind a half-megabyte Produce's tail)

    # ------------------------------------------------------------------ requests

    def request(self, api_key: int, body: Mapping[str, Any], timeout_s: float,
                version: int | None = None) -> defer.Deferred:
        """A Deferred of the answer's body (a construct ``Container``), or of a ``WireError``."""
        if self.closed:
            return self._closed()
        if version is None:
            version = self.versions[api_key]
        message = schema.MESSAGES[api_key]
        correlation = self._next_correlation()
        header = {"RequestApiKey": api_key, "RequestApiVersion": version, "CorrelationId": correlation,
                  "ClientId": self.client_id}
        frame = schema.build_frame(((schema.request_header(message.flexible(version)), header),
                                    (message.request(version), body)))
        return self._send(correlation, (frame,), functools.partial(_by_schema, api_key, version), timeout_s)

    def produce(self, topic: str, partition: int, batch: bytes | memoryview, acks: int,
                timeout_s: float, transactional_id: str | None = None) -> defer.Deferred:
        """One Produce request of ``batch`` to one partition (``shapes``, without the schema), of a
        transaction of ``transactional_id`` if given, which the broker and this connection wait
        ``timeout_s`` for: a Deferred of its ``shapes.Produced``, or of a ``WireError``."""
        if self.closed:
            return self._closed()
        version = self.versions[PRODUCE]
        correlation = self._next_correlation()
        timeout_ms = max(1, int(timeout_s * 1000))
        pieces = shapes.produce_request(version, correlation, self._client_id, acks, timeout_ms, topic.encode(),
                                        partition, batch, None if transactional_id is None else transactional_id.encode())
        # A Kafka client's batch is a view of the request it came in: sent from there (write_now).
        return self._send(correlation, pieces, functools.partial(shapes.produced, version=version), timeout_s)

    def _closed(self) -> defer.Deferred:
        return defer.fail(WireError(Errors.NETWORK_EXCEPTION, f"connection to {self.label} closed"))

    def _next_correlation(self) -> int:
        self.correlation = (self.correlation + 1) & 0x7FFFFFFF
        return self.correlation

    def _send(self, correlation: int, pieces: tuple[bytes | memoryview, ...],
              decode: Callable[[bytes | bytearray], Any], timeout_s: float) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self.pending[correlation] = _Pending(decode, d, self.clock.seconds() + timeout_s)
        write_now(self.transport, pieces)
        return d

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
        framer = self.framer
        framer.feed(data)
        try:
            while (frame := framer.next_frame()) is not None:
                self._answered(frame[1])
        except FrameTooLarge as e:
            log.warning("%s answered a frame of %d bytes: closing", self.label, e.size)
            self.transport.abortConnection()

    def _answered(self, data: bytes | bytearray) -> None:
        correlation = int.from_bytes(data[:4], "big")
        pending = self.pending.pop(correlation, None)
        if pending is None:
            return  # the answer to a request that timed out: the connection is closing
        try:
            body = pending.decode(data)
        except Exception as e:  # noqa: BLE001 - a malformed answer fails its request, not the process
            pending.deferred.errback(WireError(Errors.CORRUPT_MESSAGE, f"malformed answer from {self.label}: {e}",
                                               sent=True))
            self.transport.loseConnection()
            return
        pending.deferred.callback(body)
        if self.retired and not self.pending:
            self.transport.loseConnection()

    def expire(self, now: float) -> None:
        """Fail the requests past their deadline, each alone, and retire the connection (see the
        module docstring): closed now if no other request waits on it."""
        late = [c for c, p in self.pending.items() if p.deadline <= now]
        if not late:
            return
        self.retired = True
        for c in late:
            p = self.pending.pop(c)
            p.deferred.errback(WireError(Errors.REQUEST_TIMED_OUT, f"{self.label} did not answer in time", sent=True))
        if not self.pending:
            self.transport.abortConnection()

    def connectionLost(self, reason: Any = None) -> None:  # noqa: N802 - Twisted's name
        self.closed = True
        pending, self.pending = self.pending, {}
        for p in pending.values():
            p.deferred.errback(WireError(Errors.NETWORK_EXCEPTION, f"connection to {self.label} lost", sent=True))


@attrs.frozen
class Broker:
    node_id: int
    host: str
    port: int

    @property
    def label(self) -> str:
        return f"broker {self.node_id} at {self.host}:{self.port}"


@attrs.frozen
class PartitionLeader:
    node_id: int
    epoch: int


class Security:
    """``security.protocol``, ``sasl.*`` and ``ssl.*`` of the cluster's properties, as this client uses them."""

    def __init__(self, properties: Mapping[str, str]):
        self.protocol = properties.get("security.protocol", "plaintext").upper()
        if self.protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise ValueError(f"security.protocol={self.protocol!r}: expected plaintext, ssl, sasl_plaintext or sasl_ssl")
        self.mechanism = properties.get("sasl.mechanism", properties.get("sasl.mechanisms", "GSSAPI")).upper()
        if self.sasl and self.mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise ValueError(f"sasl.mechanism={self.mechanism}: cluster mode speaks PLAIN, SCRAM-SHA-256 and "
                             f"SCRAM-SHA-512 to the cluster")
        self.username = properties.get("sasl.username", "")
        self.password = properties.get("sasl.password", "")
        self.ca = properties.get("ssl.ca.location")
        self.certificate = properties.get("ssl.certificate.location")
        self.key = properties.get("ssl.key.location")
        self.verify_host = properties.get("ssl.endpoint.identification.algorithm", "https").lower() == "https"

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def tls_options(self, host: str) -> Any:
        """Twisted's client TLS options for ``host``: the CA given (else the system's), the client
        certificate if given, the host name checked unless turned off."""
        trust = None
        if self.ca:
            with open(self.ca, "rb") as f:
                trust = ssl.Certificate.loadPEM(f.read())
        client = None
        if self.certificate and self.key:
            with open(self.certificate, "rb") as c, open(self.key, "rb") as k:
                client = ssl.PrivateCertificate.loadPEM(c.read() + b"\n" + k.read())
        if self.verify_host:
            return ssl.optionsForClientTLS(host, trustRoot=trust, clientCertificate=client)
        return ssl.CertificateOptions(
            trustRoot=trust, verify=True, caCerts=[trust.original] if trust is not None else None,
            privateKey=client.privateKey.original if client else None,
            certificate=client.original if client else None)


class ClusterClient:
    """Connections to the cluster's brokers, and where each partition's leader is.

    ``request(node, lane, api_key, body)`` sends to one broker; ``leader(topic, partition)``
    says which one leads a partition (looking it up if needed)."""

    def __init__(self, config: ClusterConfig, reactor: Any):
        self.reactor = reactor
        self.timeout_s = config.request_timeout_ms / 1000
        self.client_id = config.client_id
        self.security = Security(config.properties)
        self.bootstrap = [_host_port(item) for item in config.bootstrap.split(",")]
        self.brokers: dict[int, Broker] = {}
        self.leaders: dict[tuple[str, int], PartitionLeader] = {}
        self.partitions: dict[str, int] = {}
        self.topics: set[str] = set()  # the topics whose metadata is kept
        self._connections: dict[tuple[int, str], Shared | BrokerConnection] = {}
        self._handshaking: dict[tuple[int, str], BrokerConnection] = {}  # opened, not yet usable
        self._retiring: list[tuple[tuple[int, str], BrokerConnection]] = []  # retired, requests still waiting
        self._refreshing: Shared | None = None
        self._sweep = task.LoopingCall(self._expire)
        self._sweep.clock = reactor
        self._bootstrap_turn = 0

    def start(self) -> None:
        self._sweeping()

    def stop(self) -> None:
        if self._sweep.running:
            self._sweep.stop()
        for conn in [*self._connections.values(), *(c for _, c in self._retiring)]:
            if isinstance(conn, BrokerConnection):
                conn.transport.loseConnection()
        self._connections.clear()
        self._retiring.clear()

    # ------------------------------------------------------------------ requests

    def request(self, node_id: int, lane: str, api_key: int, body: Mapping[str, Any] | Callable[[int], Mapping[str, Any]],
                timeout_s: float | None = None) -> defer.Deferred:
        """Send to broker ``node_id`` (-1: any bootstrap server) on the connection of ``lane``.
        ``body`` may be a function of the version agreed with the broker."""
        timeout = self.timeout_s if timeout_s is None else timeout_s

        def send(conn: BrokerConnection) -> defer.Deferred:
            version = conn.versions.get(api_key)
            if version is None:
                raise WireError(Errors.UNSUPPORTED_VERSION,
                                f"{conn.label} does not serve {schema.MESSAGES[api_key].name} at a version this client speaks")
            return conn.request(api_key, body(version) if callable(body) else body, timeout, version)

        return self.connection(node_id, lane).addCallback(send)

    def produce(self, node_id: int, topic: str, partition: int, batch: bytes | memoryview, acks: int,
                timeout_s: float, transactional_id: str | None = None) -> defer.Deferred:
        """One Produce of ``batch`` to ``topic``/``partition`` at broker ``node_id`` (in a
        transaction of ``transactional_id`` if given), which the broker and the client wait
        ``timeout_s`` for (the producing client's time left): a Deferred of its
        ``shapes.Produced``, or of a ``WireError``."""
        return self.connection(node_id, "produce").addCallbacks(
            lambda conn: conn.produce(topic, partition, batch, acks, timeout_s, transactional_id), not_sent)

    def connection(self, node_id: int, lane: str) -> defer.Deferred:
        """A Deferred of a ready connection to ``node_id`` for ``lane``, opened if needed."""
        self._sweeping()  # every request, the handshake's too, comes through here
        key = (node_id, lane)
        conn = self._connections.get(key)
        if isinstance(conn, BrokerConnection):
            if not conn.closed and not conn.retired:
                return defer.succeed(conn)
            self._retire(key, conn)
        elif conn is not None:
            return conn.wait()
        opening = self._open(node_id, key)
        if opening.called:
            # Failed before any try (the metadata names no such broker): nothing for others to wait
            # for, and kept it would answer every later request to the broker with this failure.
            return opening

        def opened(c: BrokerConnection) -> BrokerConnection:
            if self._connections.get(key) is shared:
                self._connections[key] = c
            return c

        def failed(f: Any) -> Any:
            if self._connections.get(key) is shared:
                del self._connections[key]
            return f

        shared = Shared(opening.addCallbacks(opened, failed))
        self._connections[key] = shared
        return shared.wait()

    def _open(self, node_id: int, key: tuple[int, str]) -> defer.Deferred:
        if node_id < 0:
            self._bootstrap_turn += 1
            host, port = self.bootstrap[self._bootstrap_turn % len(self.bootstrap)]
            label = f"bootstrap server {host}:{port}"
        else:
            broker = self.brokers.get(node_id)
            if broker is None:
                return defer.fail(WireError(Errors.LEADER_NOT_AVAILABLE, f"broker {node_id} is not in the metadata"))
            host, port, label = broker.host, broker.port, broker.label
        endpoint: Any = endpoints.HostnameEndpoint(self.reactor, host, port, timeout=CONNECT_TIMEOUT_S)
        if self.security.tls:
            endpoint = endpoints.wrapClientTLS(self.security.tls_options(host), endpoint)
        factory = protocol.Factory.forProtocol(lambda: BrokerConnection(self.reactor, self.client_id))

        def connected(conn: BrokerConnection) -> defer.Deferred:
            conn.label = label
            self._handshaking[key] = conn

            def settled(result: Any) -> Any:
                if self._handshaking.get(key) is conn:
                    del self._handshaking[key]
                return result

            return self._handshake(conn).addBoth(settled)

        def unreachable(f: Any) -> Any:
            if f.check(WireError):
                return f
            raise WireError(Errors.NETWORK_EXCEPTION, f"cannot reach {label}: {f.getErrorMessage()}")

        return endpoint.connect(factory).addCallback(connected).addErrback(unreachable)

    @defer.inlineCallbacks
    def _handshake(self, conn: BrokerConnection) -> Any:
        """Agree the versions, then log in: the connection once usable."""
        try:
            answer = yield conn.request(API_VERSIONS, {}, self.timeout_s, version=0)
            if answer.ErrorCode:
                raise WireError(answer.ErrorCode, f"{conn.label} refused ApiVersions")
            theirs = {a.ApiKey: (a.MinVersion, a.MaxVersion) for a in answer.ApiKeys}
            for api_key, wanted in WANTED.items():
                low, high = theirs.get(api_key, (0, -1))
                ours = min(wanted, high, schema.MESSAGES[api_key].valid[1])
                if ours >= max(low, NEEDED[api_key]):
                    conn.versions[api_key] = ours
            for api_key in (PRODUCE, FETCH, METADATA):
                if api_key not in conn.versions:
                    raise WireError(Errors.UNSUPPORTED_VERSION,
                                    f"{conn.label} does not serve {schema.MESSAGES[api_key].name} with record batches")
            if self.security.sasl:
                yield self._login(conn)
        except Exception:
            conn.transport.abortConnection()
            raise
        return conn

    @defer.inlineCallbacks
    def _login(self, conn: BrokerConnection) -> Any:
        sec = self.security
        answer = yield conn.request(SASL_HANDSHAKE, {"Mechanism": sec.mechanism}, self.timeout_s)
        if answer.ErrorCode:
            raise WireError(answer.ErrorCode, f"{conn.label} does not take SASL {sec.mechanism} "
                                              f"(it offers {', '.join(answer.Mechanisms)})")
        if sec.mechanism == "PLAIN":
            yield self._authenticate(conn, b"\0" + sec.username.encode() + b"\0" + sec.password.encode())
            return
        import scramp  # only when SCRAM is configured

        client = scramp.ScramClient([sec.mechanism], sec.username, sec.password)
        server_first = yield self._authenticate(conn, client.get_client_first().encode())
        client.set_server_first(server_first.decode())
        server_final = yield self._authenticate(conn, client.get_client_final().encode())
        try:
            client.set_server_final(server_final.decode())
        except scramp.ScramException as e:
            raise WireError(Errors.SASL_AUTHENTICATION_FAILED, f"{conn.label} did not prove the password: {e}") from e

    @defer.inlineCallbacks
    def _authenticate(self, conn: BrokerConnection, token: bytes) -> Any:
        answer = yield conn.request(SASL_AUTHENTICATE, {"AuthBytes": token}, self.timeout_s)
        if answer.ErrorCode:
            raise WireError(answer.ErrorCode, f"{conn.label} refused the login of {self.security.username!r}: "
                                              f"{answer.ErrorMessage or Errors(answer.ErrorCode).name}")
        return bytes(answer.AuthBytes)

    def abandon(self, lane: str) -> None:
        """Close ``lane``'s connections, those still agreeing versions or logging in too: its
        requests fail now, and the next one opens a new connection (a connection opened while the
        cluster did not answer may never carry an answer)."""
        for key, conn in [*self._connections.items(), *self._handshaking.items(), *self._retiring]:
            if key[1] == lane and isinstance(conn, BrokerConnection):
                conn.transport.abortConnection()

    def _retire(self, key: tuple[int, str], conn: BrokerConnection) -> None:
        """``conn`` serves ``key`` no more: kept open while a request on it waits (the oldest of
        ``key`` closed past ``RETIRING_MAX``)."""
        if self._connections.get(key) is conn:
            del self._connections[key]
        if conn.closed or not conn.pending:
            return  # closed, or closing: nothing waits on it
        self._retiring.append((key, conn))
        same = [c for k, c in self._retiring if k == key]
        for oldest in same[:len(same) - RETIRING_MAX]:
            self._retiring.remove((key, oldest))
            oldest.transport.abortConnection()

    def _sweeping(self) -> None:
        """Check requests for their timeout every ``SWEEP_S`` from now on, until none waits."""
        if not self._sweep.running:
            self._sweep.start(SWEEP_S, now=False)

    def _expire(self) -> None:
        now = self.reactor.seconds()
        self._retiring = [(key, conn) for key, conn in self._retiring if not conn.closed]
        for key, conn in [*self._connections.items(), *self._handshaking.items(), *self._retiring]:
            if isinstance(conn, BrokerConnection) and conn.pending:
                conn.expire(now)
                if conn.retired and self._connections.get(key) is conn:
                    self._retire(key, conn)
        if not self._handshaking and all(isinstance(conn, BrokerConnection) and not conn.pending for conn in
                                         [*self._connections.values(), *(c for _, c in self._retiring)]):
            self._sweep.stop()  # no request waits, none is opening a connection: the next request starts it again

    # ------------------------------------------------------------------ metadata

    def leader(self, topic: str, partition: int) -> defer.Deferred | PartitionLeader:
        """The partition's leader: at once when known, else a Deferred of it after a lookup."""
        found = self.leaders.get((topic, partition))
        if found is not None and found.node_id in self.brokers:
            return found
        self.topics.add(topic)
        return self.refresh().addCallback(lambda _: self._known_leader(topic, partition))

    def _known_leader(self, topic: str, partition: int) -> PartitionLeader:
        found = self.leaders.get((topic, partition))
        if found is None or found.node_id not in self.brokers:
            raise WireError(Errors.LEADER_NOT_AVAILABLE, f"{topic}/{partition} has no leader in the cluster's metadata")
        return found

    def stale(self, topic: str, partition: int) -> None:
        """An answer said the partition's leader moved: look it up again before the next request."""
        self.leaders.pop((topic, partition), None)

    def refresh(self) -> defer.Deferred:
        """Fires once the metadata of the topics in use was read again (one request at a time)."""
        if self._refreshing is not None:
            return self._refreshing.wait()
        topics = sorted(self.topics)
        d = self.request(-1, "metadata", METADATA, lambda v: {
            "Topics": [{"Name": t} for t in topics], "AllowAutoTopicCreation": False})

        def done(result: Any) -> Any:
            self._refreshing = None
            return result

        self._refreshing = Shared(d.addCallback(self.learn).addBoth(done))
        return self._refreshing.wait()

    def learn(self, answer: Any, complete: bool = False) -> None:
        """Take the brokers and the leaders of a Metadata ``answer`` (of the topics in use, or of
        every topic: ``complete``, where a topic left out is one the cluster no longer has)."""
        self.brokers = {b.NodeId: Broker(b.NodeId, b.Host, b.Port) for b in answer.Brokers}
        named = {t.Name for t in answer.Topics}
        for t in answer.Topics:
            if t.ErrorCode:
                self._forget(t.Name)
                continue
            self.partitions[t.Name] = len(t.Partitions)
            for p in t.Partitions:
                self.leaders[(t.Name, p.PartitionIndex)] = PartitionLeader(p.LeaderId, p.get("LeaderEpoch", -1))
        if complete:
            for name in [n for n in self.partitions if n not in named]:
                self._forget(name)

    def _forget(self, topic: str) -> None:
        self.partitions.pop(topic, None)
        for key in [k for k in self.leaders if k[0] == topic]:
            del self.leaders[key]


def _host_port(item: str) -> tuple[str, int]:
    host, _, port = item.strip().rpartition(":")
    return host.strip("[]"), int(port)
