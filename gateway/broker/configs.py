"""The broker settings clients change at run time: Kafka's dynamic broker configs (KIP-226),
which AlterConfigs and IncrementalAlterConfigs set on the BROKER resource, for one broker or as
the cluster-wide default, and DescribeConfigs shows.

polygate takes the settings of Kafka's that a client may change at run time and that have no
meaning in polygate (``KEPT``: thread pools, the Kerberos login of SASL listeners, ...; librdkafka's
own tests set some): it checks their values as Kafka does, keeps them as given and shows them
back, and uses none of them, as it keeps Kafka's topic settings it has no use for. A setting polygate
has its own way to set (``OWN_WAY``: a command-line option, or a topic's own setting) is refused,
as Kafka refuses a setting that cannot change at run time: ``INVALID_REQUEST`` naming the way.
Any other name is ``INVALID_CONFIG`` (Kafka would keep a name it does not know as a custom
setting; polygate keeps none). A value of the wrong type is ``INVALID_REQUEST``, Kafka's answer;
appending to or subtracting from a setting that is not a list is ``INVALID_CONFIG``, as Kafka's.
The settings of SASL listeners are per broker: not as a cluster-wide default (``INVALID_REQUEST``).

Kept in the store where it keeps them (``BrokerConfigStorage``: the local engine's journal),
else in this gateway's memory: a store in front of a cluster leaves the cluster's brokers'
settings to the cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from gateway import model as m
from gateway.broker.calls import errors_as, then
from gateway.model import CommandError, ErrorCode
from gateway.storage.interface import BrokerConfigStorage

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.storage.interface import MayWait

log = logging.getLogger(__name__)


def _int(text: str) -> str:
    int(text)
    return text


def _number(text: str) -> str:
    float(text)
    return text


def _bool(text: str) -> str:
    if text.lower() not in ("true", "false"):
        raise ValueError(text)
    return text.lower()


def _text(text: str) -> str:
    return text


LIST = _text  # a comma-separated list: the one kind that may be appended to or subtracted from

KEPT: dict[str, Callable[[str], str]] = {
    # thread pools
    "background.threads": _int, "num.io.threads": _int, "num.network.threads": _int,
    "num.replica.fetchers": _int, "num.recovery.threads.per.data.dir": _int,
    # the log cleaner's resources
    "log.cleaner.threads": _int, "log.cleaner.io.max.bytes.per.second": _number,
    "log.cleaner.dedupe.buffer.size": _int, "log.cleaner.io.buffer.size": _int,
    "log.cleaner.io.buffer.load.factor": _number, "log.cleaner.backoff.ms": _int,
    # the Kerberos and token logins of SASL listeners (per broker)
    "sasl.kerberos.service.name": _text, "sasl.kerberos.kinit.cmd": _text,
    "sasl.kerberos.ticket.renew.window.factor": _number, "sasl.kerberos.ticket.renew.jitter": _number,
    "sasl.kerberos.min.time.before.relogin": _int, "sasl.kerberos.principal.to.local.rules": LIST,
    "sasl.login.refresh.window.factor": _number, "sasl.login.refresh.window.jitter": _number,
    "sasl.login.refresh.min.period.seconds": _int, "sasl.login.refresh.buffer.seconds": _int,
    # replication throttles, producer state, metrics
    "leader.replication.throttled.rate": _int, "follower.replication.throttled.rate": _int,
    "replica.alter.log.dirs.io.max.bytes.per.second": _int, "producer.id.expiration.ms": _int,
    "transaction.partition.verification.enable": _bool, "metric.reporters": LIST,
    "max.connection.creation.rate": _int,
    # the defaults of Kafka's topic settings polygate keeps but does not use (topic_configs.KAFKA_ONLY)
    "log.roll.ms": _int, "log.roll.jitter.ms": _int, "log.index.size.max.bytes": _int,
    "log.index.interval.bytes": _int, "log.segment.delete.delay.ms": _int, "log.preallocate": _bool,
    "log.cleaner.max.compaction.lag.ms": _int, "log.message.timestamp.before.max.ms": _int,
    "log.message.timestamp.after.max.ms": _int, "compression.gzip.level": _int,
    "compression.lz4.level": _int, "compression.zstd.level": _int, "unclean.leader.election.enable": _bool,
}
"""Kafka's dynamic broker settings that mean nothing to polygate: taken, kept and shown back."""

PER_BROKER = frozenset(name for name in KEPT if name.startswith("sasl."))
"""Settings Kafka takes for one broker only, never as the cluster-wide default."""

OWN_WAY: dict[str, str] = {
    "log.retention.ms": "--retention-ms", "log.retention.minutes": "--retention-ms",
    "log.retention.hours": "--retention-ms", "log.retention.bytes": "--retention-bytes",
    "log.segment.bytes": "--segment-bytes", "log.flush.interval.ms": "--fsync",
    "log.flush.interval.messages": "--fsync", "num.partitions": "--default-partitions",
    "default.replication.factor": "--replication-factor", "min.insync.replicas": "--min-insync-replicas",
    "max.connections": "--max-connections", "max.connections.per.ip": "--max-connections-per-peer",
    "connections.max.idle.ms": "--idle-timeout", "message.max.bytes": "--max-frame",
    "socket.request.max.bytes": "--max-frame", "listeners": "--listen", "advertised.listeners": "--advertised-host",
    "log.dirs": "--data-dir", "log.dir": "--data-dir",
    "auto.create.topics.enable": "--codec-option kafka.auto.create.topics.enable",
    "log.cleanup.policy": "each topic's cleanup.policy", "compression.type": "each topic's compression.type",
    "log.cleaner.delete.retention.ms": "each topic's delete.retention.ms",
    "log.cleaner.min.cleanable.ratio": "each topic's min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "each topic's min.compaction.lag.ms",
}
"""Kafka's broker settings that polygate sets its own way: not changed at run time."""

OWN, DEFAULTS = "own", "defaults"  # the two levels, and their keys in the store


def change_list(current: str | None, operation: str, value: str | None) -> str | None:
    """The comma-separated list ``current`` with ``value``'s items appended (each once) or
    subtracted; None once it is empty."""
    items = [i for i in (current or "").split(",") if i]
    for item in (value or "").split(","):
        if operation == "append" and item and item not in items:
            items.append(item)
        elif operation == "subtract" and item in items:
            items.remove(item)
    return ",".join(items) if items else None


def checked(name: str, value: str, own: bool) -> str:
    """``value`` of setting ``name`` as kept; ``CommandError`` as Kafka answers a refused one."""
    if name in OWN_WAY:
        raise CommandError(ErrorCode.INVALID_REQUEST, f"{name} cannot change at run time: polygate sets it "
                                                      f"with {OWN_WAY[name]}")
    if name not in KEPT:
        raise CommandError(ErrorCode.INVALID_CONFIG, f"unknown broker setting {name!r}")
    if not own and name in PER_BROKER:
        raise CommandError(ErrorCode.INVALID_REQUEST, f"{name} is set per broker, not as the cluster-wide default")
    try:
        return KEPT[name](value)
    except ValueError:
        raise CommandError(ErrorCode.INVALID_REQUEST, f"invalid value {value!r} for {name}") from None


class BrokerConfigs:
    """The settings of ``KEPT`` clients set on this broker (``own``) and as the cluster-wide
    default (``defaults``), each a name to its text."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self._store = cast(BrokerConfigStorage, broker.store) if broker.store.keeps_broker_configs else None
        records = self._store.broker_configs() if self._store is not None else {}
        self.levels: dict[str, dict[str, str]] = {level: dict(records.get(level) or {}) for level in (OWN, DEFAULTS)}

    def describe(self, cmd: m.DescribeBrokerConfigs) -> m.DescribeBrokerConfigsResult:
        return m.DescribeBrokerConfigsResult(tuple(sorted(self.levels[OWN].items())),
                                             tuple(sorted(self.levels[DEFAULTS].items())))

    @errors_as(m.AlterBrokerConfigsResult)
    def alter(self, cmd: m.AlterBrokerConfigs) -> MayWait[m.AlterBrokerConfigsResult]:
        """Apply ``cmd.changes`` in order to the level's settings (all of them first cleared with
        ``replace``); the first refused one refuses the whole command, as Kafka's."""
        level = OWN if cmd.own else DEFAULTS
        current = self.levels[level]
        settings: dict[str, str] = {} if cmd.replace else dict(current)
        for name, operation, value in cmd.changes:
            if operation == "delete":
                settings.pop(name, None)
                continue
            if operation in ("append", "subtract"):
                if KEPT.get(name) is not LIST:
                    raise CommandError(ErrorCode.INVALID_CONFIG, f"{name} is not a list: {operation} does not apply")
                value = change_list(settings.get(name), operation, value)
                if value is None:
                    settings.pop(name, None)
                    continue
            elif operation != "set":
                raise CommandError(ErrorCode.INVALID_REQUEST, f"unknown config operation {operation!r}")
            settings[name] = checked(name, value or "", cmd.own)
        if cmd.validate_only or settings == current:
            return m.AlterBrokerConfigsResult()

        def kept(_: Any) -> MayWait[m.AlterBrokerConfigsResult]:
            self.levels[level] = settings
            log.info("broker settings (%s) now %s", "this broker" if cmd.own else "cluster-wide default",
                     settings or "none")
            return self.broker.durable(m.AlterBrokerConfigsResult())

        return then(self._store.put_broker_config(level, settings or None) if self._store is not None else None, kept)

