"""Fetch requests of one partition straight to its leader, for a Spark task (``protocol=kafka``).

librdkafka hands out one ``Message`` object per record; reading a range
with Fetch requests of our own gives the record batches as bytes, which
``decode`` turns into Arrow buffers in one pass. ``Settings.of`` says
whether this reader can serve the ``kafka.*`` options (PLAINTEXT, SSL,
SASL PLAIN and SCRAM, isolation level, fetch sizes); when it cannot, and at
a magic 0/1 message set, the range is read with librdkafka as before.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import attrs

from gateway.clients.kafka import KafkaClient, KafkaError
from gateway.codecs.kafka.errors import Errors

FETCH, METADATA, API_VERSIONS = 1, 3, 18
FETCH_VERSIONS = (4, 11)  # 4: aborted transactions; 11: the newest non-flexible version
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
FETCH_BYTES = 16 << 20
# errors after which the partition's leader is looked up again and the fetch retried
RETRIABLE = frozenset({
    Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.LEADER_NOT_AVAILABLE, Errors.NOT_LEADER_OR_FOLLOWER,
    Errors.REQUEST_TIMED_OUT, Errors.NETWORK_EXCEPTION, Errors.KAFKA_STORAGE_ERROR, Errors.FENCED_LEADER_EPOCH,
    Errors.UNKNOWN_LEADER_EPOCH, Errors.OFFSET_NOT_AVAILABLE,
})
# librdkafka options that change nothing in what this reader fetches
_IGNORED = {"client.id", "socket.timeout.ms", "check.crcs", "fetch.wait.max.ms", "fetch.min.bytes",
            "log_level", "group.id", "enable.auto.commit", "auto.offset.reset"}


class Unsupported(Exception):
    """This reader cannot read the range; librdkafka reads it."""


@attrs.frozen
class Settings:
    """What the Fetch reader needs of the ``kafka.*`` options."""

    tls: ssl.SSLContext | None = None
    mechanism: str | None = None
    user: str = ""
    password: str = attrs.field(default="", repr=False)
    read_committed: bool = True
    fetch_bytes: int = FETCH_BYTES

    @classmethod
    def of(cls, config: Mapping[str, str]) -> Settings | None:
        """The settings for librdkafka ``config``; None when it names anything this reader does not do."""
        known = {"security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
                 "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
                 "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification",
                 "isolation.level", "fetch.max.bytes", "max.partition.fetch.bytes", *_IGNORED}
        config = {key.lower(): str(value) for key, value in config.items()}
        if config.keys() - known:
            return None
        security = config.get("security.protocol", "plaintext").lower()
        if security not in ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl"):
            return None
        mechanism = None
        if security.startswith("sasl"):
            mechanism = config.get("sasl.mechanism", config.get("sasl.mechanisms", "GSSAPI")).upper()
            if mechanism not in MECHANISMS:
                return None
        isolation = config.get("isolation.level", "read_committed").lower()
        if isolation not in ("read_committed", "read_uncommitted"):
            return None
        try:
            sizes = [int(config[key]) for key in ("fetch.max.bytes", "max.partition.fetch.bytes") if key in config]
        except ValueError:
            return None  # librdkafka says what is wrong with it
        return cls(tls=_tls(config) if security.endswith("ssl") else None, mechanism=mechanism,
                   user=config.get("sasl.username", ""), password=config.get("sasl.password", ""),
                   read_committed=isolation == "read_committed", fetch_bytes=min(sizes) if sizes else FETCH_BYTES)


def _tls(config: Mapping[str, str]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=config.get("ssl.ca.location"))
    if "ssl.certificate.location" in config:
        context.load_cert_chain(config["ssl.certificate.location"], config.get("ssl.key.location"),
                                config.get("ssl.key.password"))
    if config.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        context.check_hostname = False
    if config.get("enable.ssl.certificate.verification", "true").lower() == "false":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


@attrs.frozen
class Fetched:
    """One partition's fetch answer."""

    error: int
    high_watermark: int
    last_stable_offset: int
    aborted: list[tuple[int, int]] | None  # sorted by first offset; None when reading uncommitted
    records: bytes


def open_client(settings: Settings, timeout: float, host: str, port: int) -> KafkaClient:
    """A connection to a broker, logged in as ``settings`` say."""
    client = KafkaClient(host, port, timeout, settings.tls, client_id="polygate-spark")
    try:
        if settings.mechanism:
            client.login(settings.user, settings.password, settings.mechanism)
        return client
    except BaseException:
        client.close()
        raise


def address_of(text: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port`` (``[v6]:port`` too)."""
    host, _, port = text.strip().rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class PartitionFetcher:
    """A connection to the leader of one partition, fetching from it.

    Raises ``Unsupported`` when the leader offers no Fetch version from 4 to 11, ``KafkaError`` for
    an error the metadata gives, ``OSError`` when a connection fails.
    """

    def __init__(self, bootstrap: str, settings: Settings, topic: str, partition: int, timeout: float = 30.0):
        self.settings, self.topic, self.partition, self.timeout = settings, topic, partition, timeout
        self.bootstraps = [address_of(b) for b in bootstrap.split(",") if b.strip()]
        self.client: KafkaClient | None = None
        self.version = FETCH_VERSIONS[0]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def __enter__(self) -> PartitionFetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> KafkaClient:
        """Find the partition's leader (through the first bootstrap that answers) and connect to it."""
        self.close()
        failure: OSError | None = None
        for host, port in self.bootstraps:
            try:
                client = open_client(self.settings, self.timeout, host, port)
                break
            except OSError as e:
                failure = e
        else:
            raise failure or OSError("no bootstrap server")
        try:
            leader = self._leader(client)
            if leader != (host, port):
                client.close()
                client = open_client(self.settings, self.timeout, *leader)
            versions = {k.ApiKey: k for k in client.call(API_VERSIONS, 0, {}).ApiKeys}
            fetch = versions.get(FETCH)
            if fetch is None or fetch.MaxVersion < FETCH_VERSIONS[0] or fetch.MinVersion > FETCH_VERSIONS[1]:
                raise Unsupported("the leader offers no Fetch version from 4 to 11")
            self.version = min(fetch.MaxVersion, FETCH_VERSIONS[1])
        except BaseException:
            client.close()
            raise
        self.client = client
        return client

    def _leader(self, client: KafkaClient) -> tuple[str, int]:
        answer = client.call(METADATA, 4, {"Topics": [{"Name": self.topic}], "AllowAutoTopicCreation": False})
        topic = next((t for t in answer.Topics if t.Name == self.topic), None)
        if topic is None or topic.ErrorCode:
            raise KafkaError(topic.ErrorCode if topic else 3, f"topic {self.topic}")
        part = next((p for p in topic.Partitions if p.PartitionIndex == self.partition), None)
        if part is None or part.ErrorCode or part.LeaderId < 0:
            raise KafkaError(part.ErrorCode if part and part.ErrorCode else 5,
                             f"no leader of {self.topic}/{self.partition}")
        broker = next((b for b in answer.Brokers if b.NodeId == part.LeaderId), None)
        if broker is None:
            raise KafkaError(5, f"leader {part.LeaderId} of {self.topic}/{self.partition} is not in the metadata")
        return broker.Host, broker.Port

    def fetch(self, offset: int, max_wait_ms: int) -> Fetched:
        """The partition's records from ``offset`` (waiting up to ``max_wait_ms`` for the first)."""
        client = self.client if self.client is not None else self.connect()
        size = self.settings.fetch_bytes
        body = {"ReplicaId": -1, "MaxWaitMs": max_wait_ms, "MinBytes": 1, "MaxBytes": size,
                "IsolationLevel": 1 if self.settings.read_committed else 0, "SessionId": 0, "SessionEpoch": -1,
                "Topics": [{"Topic": self.topic, "Partitions": [{
                    "Partition": self.partition, "CurrentLeaderEpoch": -1, "FetchOffset": offset,
                    "LogStartOffset": -1, "PartitionMaxBytes": size}]}],
                "ForgottenTopicsData": [], "RackId": ""}
        try:
            answer = client.call(FETCH, self.version, body)
        except BaseException:
            self.close()
            raise
        part = answer.Responses[0].Partitions[0]
        aborted = None
        if self.settings.read_committed:
            aborted = sorted(((a.ProducerId, a.FirstOffset) for a in part.AbortedTransactions or ()),
                             key=lambda a: a[1])
        return Fetched(part.ErrorCode, part.HighWatermark, part.LastStableOffset, aborted, part.Records or b"")
