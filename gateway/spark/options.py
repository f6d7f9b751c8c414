"""The options of the ``polygate`` Spark data source, parsed once on the driver.

Names follow Spark's Kafka source where one exists, so code ports by changing
the format name: ``startingOffsets``/``endingOffsets`` are ``"earliest"``,
``"latest"`` or JSON ``{"orders": {"0": 23, "1": -2}}`` (-2 earliest, -1
latest); ``startingTimestamp``/``endingTimestamp`` (ms, every partition) and
``startingOffsetsByTimestamp``/``endingOffsetsByTimestamp`` (JSON of ms per
partition) take precedence over offsets. A read plans one Spark partition per
topic partition, cut into ranges of at most ``maxRecordsPerPartition`` records
and, like Spark's ``minPartitions``, into at least ``minPartitions`` ranges.
Options named ``kafka.<key>`` are librdkafka configuration: the tasks'
own Fetch and Produce requests take the security, isolation and fetch size
settings (``fetch.Settings``), and any other key sends the task's reads and
writes through librdkafka, which gets them unchanged. ``protocol`` is ``kafka`` (default) or ``tank`` and
``bootstrap`` the host:port of that listener.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import overload

import attrs

EARLIEST = -2
LATEST = -1

TopicPartition = tuple[str, int]


class OptionError(ValueError):
    """An option is missing or malformed; the message names it."""


@attrs.frozen
class Bound:
    """Where a read starts or ends in each partition.

    ``offsets``/``timestamps`` name partitions explicitly; every other
    partition gets ``timestamp`` when set, else ``default`` (EARLIEST/LATEST).
    """

    default: int
    offsets: Mapping[TopicPartition, int] = attrs.field(factory=dict)
    timestamp: int | None = None
    timestamps: Mapping[TopicPartition, int] = attrs.field(factory=dict)


@attrs.frozen
class SourceOptions:
    bootstrap: str
    topics: tuple[str, ...]
    protocol: str
    starting: Bound
    ending: Bound
    max_records_per_trigger: int | None
    max_records_per_partition: int
    min_partitions: int
    poll_timeout_ms: int
    client_config: Mapping[str, str]


PROTOCOLS = ("kafka", "tank")
DEFAULT_MAX_RECORDS_PER_PARTITION = 2_000_000


@overload
def _int(options: Mapping[str, str], name: str, default: int) -> int: ...


@overload
def _int(options: Mapping[str, str], name: str, default: None) -> int | None: ...


def _int(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {raw!r}") from None
    if value <= 0:
        raise OptionError(f"option {name} must be positive, got {value}")
    return value


def _per_partition(name: str, raw: str) -> dict[TopicPartition, int]:
    """``{"topic": {"0": 23}}`` → ``{("topic", 0): 23}``."""
    try:
        parsed = json.loads(raw)
        return {(topic, int(part)): int(value) for topic, parts in parsed.items()
                for part, value in parts.items()}
    except (ValueError, AttributeError, TypeError):
        raise OptionError(f'option {name} must be "earliest", "latest" or JSON like '
                          f'{{"topic":{{"0":23,"1":-2}}}}, got {raw!r}') from None


def parse_bound(options: Mapping[str, str], prefix: str, default: int) -> Bound:
    """``prefix`` is ``"starting"`` or ``"ending"``."""
    if (ts := options.get(f"{prefix}Timestamp")) is not None:
        try:
            return Bound(default, timestamp=int(ts))
        except ValueError:
            raise OptionError(f"option {prefix}Timestamp must be milliseconds, got {ts!r}") from None
    if (by_ts := options.get(f"{prefix}OffsetsByTimestamp")) is not None:
        return Bound(default, timestamps=_per_partition(f"{prefix}OffsetsByTimestamp", by_ts))
    raw = options.get(f"{prefix}Offsets")
    if raw is None:
        return Bound(default)
    if raw.strip().lower() in ("earliest", "latest"):
        return Bound(EARLIEST if raw.strip().lower() == "earliest" else LATEST)
    offsets = _per_partition(f"{prefix}Offsets", raw)
    if any(value < EARLIEST for value in offsets.values()):
        raise OptionError(f"option {prefix}Offsets: offsets are >= 0, -1 (latest) or -2 (earliest)")
    return Bound(default, offsets=offsets)


def parse(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    """Validate the reader options (``options`` is Spark's case-insensitive map)."""
    bootstrap = options.get("bootstrap") or options.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise OptionError('option "bootstrap" (host:port of the gateway\'s listener) is required')
    topic = options.get("topic") or options.get("subscribe")
    if not topic:
        raise OptionError('option "topic" is required')
    protocol = options.get("protocol", "kafka").lower()
    if protocol not in PROTOCOLS:
        raise OptionError(f"option protocol: {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    ending = parse_bound(options, "ending", LATEST)
    if streaming and ending != Bound(LATEST):
        raise OptionError("endingOffsets and endingTimestamp are for batch reads only")
    starting = parse_bound(options, "starting", LATEST if streaming else EARLIEST)
    return SourceOptions(
        bootstrap=bootstrap,
        topics=tuple(t.strip() for t in topic.split(",") if t.strip()),
        protocol=protocol,
        starting=starting,
        ending=ending,
        max_records_per_trigger=_int(options, "maxRecordsPerTrigger", None)
        or _int(options, "maxOffsetsPerTrigger", None),
        max_records_per_partition=_int(options, "maxRecordsPerPartition", DEFAULT_MAX_RECORDS_PER_PARTITION),
        min_partitions=_int(options, "minPartitions", 1),
        poll_timeout_ms=_int(options, "pollTimeoutMs", 120_000),
        client_config=client_config(options),
    )


def client_config(options: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.*`` options without their prefix (``kafka.bootstrap.servers`` excepted)."""
    return {key[len("kafka."):]: value for key, value in options.items()
            if key.lower().startswith("kafka.") and key.lower() != "kafka.bootstrap.servers"}
