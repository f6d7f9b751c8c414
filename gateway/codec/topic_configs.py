"""Topic settings under Kafka's names: the one table of the settings polygate keeps per topic, how
each is parsed and checked, and the effective value of each (the topic's own, else the server's).

Codecs that take settings by Kafka's names (Kafka CreateTopics, AlterConfigs,
IncrementalAlterConfigs, DescribeConfigs; Cursus CREATE's ``cleanup_policy=``) and
the cluster store read and write ``TopicConfig`` through ``apply`` and ``describe``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from gateway.model import CommandError, ErrorCode, TopicConfig

POLICIES = {"delete": "delete", "compact": "compact", "compact,delete": "compact,delete",
            "delete,compact": "compact,delete"}


def _int(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError("a whole number") from None
        if value < low:
            raise ValueError(f"at least {low}")
        return value
    return parse


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("a number from 0 to 1") from None
    if not 0 <= value <= 1:
        raise ValueError("a number from 0 to 1")
    return value


COMPRESSION_TYPES = ("uncompressed", "gzip", "snappy", "lz4", "zstd", "producer")
"""Kafka's values of ``compression.type``: the codec a topic's batches are stored in, or ``producer``:
as each producer sent it."""


def _compression(text: str) -> str:
    if text not in COMPRESSION_TYPES:
        raise ValueError(", ".join(COMPRESSION_TYPES[:-1]) + " or " + COMPRESSION_TYPES[-1])
    return text


def _policy(text: str) -> str:
    policy = POLICIES.get(",".join(p.strip() for p in text.lower().split(",")))
    if policy is None:
        raise ValueError("delete, compact, or compact,delete")
    return policy


@attrs.frozen
class Setting:
    field: str  # the TopicConfig field
    parse: Callable[[str], Any]
    doc: str


SETTINGS: dict[str, Setting] = {
    "cleanup.policy": Setting("cleanup_policy", _policy, "delete: segments past retention are deleted; compact: "
                                                        "the last record of each key is kept; compact,delete: both"),
    "retention.ms": Setting("retention_ms", _int(-1), "age past which a segment is deleted (-1: never)"),
    "retention.bytes": Setting("retention_bytes", _int(-1), "size past which a partition's oldest segments are "
                                                            "deleted (-1: none)"),
    "segment.bytes": Setting("segment_bytes", _int(1024), "size of a segment file"),
    "delete.retention.ms": Setting("delete_retention_ms", _int(0), "how long a compacted topic keeps a tombstone"),
    "min.cleanable.dirty.ratio": Setting("min_cleanable_dirty_ratio", _ratio,
                                         "share of a log not yet compacted past which the cleaner compacts it"),
    "min.compaction.lag.ms": Setting("min_compaction_lag_ms", _int(0), "records younger than this are not "
                                                                       "compacted"),
    "compression.type": Setting("compression_type", _compression, "the compression batches are stored in "
                                                                  "(producer: each as its producer sent it)"),
}
"""Every setting a topic keeps, by Kafka's name."""

READ_ONLY = {"message.timestamp.type": "CreateTime"}
"""Settings shown by DescribeConfigs that cannot be changed: what polygate always does."""

KAFKA_ONLY = frozenset({
    "compression.gzip.level", "compression.lz4.level", "compression.zstd.level", "file.delete.delay.ms",
    "flush.messages", "flush.ms", "follower.replication.throttled.replicas", "index.interval.bytes",
    "leader.replication.throttled.replicas", "local.retention.bytes", "local.retention.ms",
    "max.compaction.lag.ms", "max.message.bytes", "message.downconversion.enable", "message.format.version",
    "message.timestamp.after.max.ms", "message.timestamp.before.max.ms", "message.timestamp.difference.max.ms",
    "min.insync.replicas", "preallocate", "remote.log.copy.disable", "remote.log.delete.on.disable",
    "remote.storage.enable", "segment.index.bytes", "segment.jitter.ms", "segment.ms",
    "unclean.leader.election.enable",
})
"""Kafka's other topic settings (its ``TopicConfig``, 3.9 and 4.0): polygate has no use for them, but
takes them (frameworks set some, such as ``min.insync.replicas``, on the topics they create), keeps
them as given and shows them back. Any other name is not a topic setting: ``INVALID_CONFIG``, as
Kafka answers."""


def parse(name: str, value: str) -> Any:
    """The value of setting ``name`` (one of ``SETTINGS``) given as text; ``CommandError(INVALID_CONFIG)``
    naming what is allowed for a bad one."""
    try:
        return SETTINGS[name].parse(value)
    except ValueError as e:
        raise CommandError(ErrorCode.INVALID_CONFIG, f"{name}={value!r}: expected {e}") from None


def apply(config: TopicConfig, changes: Mapping[str, str | None]) -> TopicConfig:
    """``config`` with ``changes`` (a name to its text, or to None: back to the server's default).

    The settings of ``SETTINGS`` are checked and kept in their fields; a read-only one may only be
    given its fixed value; one of ``KAFKA_ONLY`` is kept as given and shown back, in ``extras``;
    any other name is refused (``INVALID_CONFIG``)."""
    fields: dict[str, Any] = {}
    extras = dict(config.extras)
    for name, value in changes.items():
        if name in SETTINGS:
            fields[SETTINGS[name].field] = None if value is None else parse(name, value)
        elif name in READ_ONLY:
            if value is not None and value != READ_ONLY[name]:
                raise CommandError(ErrorCode.INVALID_CONFIG, f"{name} is always {READ_ONLY[name]}, not {value!r}")
        elif name not in KAFKA_ONLY:
            raise CommandError(ErrorCode.INVALID_CONFIG, f"unknown topic setting {name!r}")
        elif value is None:
            extras.pop(name, None)
        else:
            extras[name] = value
    return attrs.evolve(config, **fields, extras=extras)


def from_pairs(pairs: Iterable[tuple[str, str | None]]) -> TopicConfig:
    """A new topic's config from ``(name, value)`` pairs (a value of None is left at the default)."""
    return apply(TopicConfig(), {name: value for name, value in pairs if value is not None})


def describe(config: TopicConfig, defaults: TopicConfig) -> list[tuple[str, str, bool]]:
    """``(name, value, is_default)`` of every setting: the topic's own value, else ``defaults``'
    (the server's), then the read-only ones."""
    out = []
    for name, s in SETTINGS.items():
        own = getattr(config, s.field)
        value = own if own is not None else getattr(defaults, s.field)
        out.append((name, _text(value), own is None))
    out += [(name, value, True) for name, value in READ_ONLY.items()]
    out += [(name, str(value), False) for name, value in sorted(config.extras.items())]
    return out


def _text(value: Any) -> str:
    if value is None:
        return "-1"
    return repr(value) if isinstance(value, float) else str(value)


def changes_of(config: TopicConfig) -> dict[str, str]:
    """The settings ``config`` sets (not left at the default), by Kafka's name, as text."""
    return {name: _text(getattr(config, s.field)) for name, s in SETTINGS.items()
            if getattr(config, s.field) is not None}
