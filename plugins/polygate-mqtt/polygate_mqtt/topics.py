"""How MQTT topic names and filters map onto the log.

The rule, in one line: **the first level of an MQTT topic name is the log
topic, and the whole MQTT topic name is the record key.** ``sensors/kitchen/temp``
is appended to log topic ``sensors`` with key ``b"sensors/kitchen/temp"``;
the gateway partitions by that key (murmur2, as Kafka clients do), so one
MQTT topic keeps its order.

Log topic names are limited to ``[A-Za-z0-9._=-]{1,249}``. A first level
outside that set (empty as in ``/a``, ``$SYS``, spaces, non-ASCII, longer
than 249 characters) names no log topic: a PUBLISH there closes the
connection (MQTT 3.1.1 has no negative PUBACK; 3.3.5 lets the server close)
and a subscription filter there is refused with SUBACK ``0x80``. So is a
filter whose first level is a wildcard (``#``, ``+/x``): it would mean "every
log topic", including ones created later, which a subscription whose
partitions are fixed when it is made cannot honour.

Reading back, the MQTT topic name of a record in log topic ``T`` is its key
when the key is a UTF-8 topic name whose first level is ``T`` (every record
an MQTT client published); any other record (another protocol's key, or no
key) is delivered under the topic name ``T`` itself, so ``T`` and ``T/#``
see everything other protocols write to ``T``.
"""

from __future__ import annotations

import re

LOG_TOPIC = re.compile(r"[A-Za-z0-9._=\-]{1,249}")
MAX_TOPIC_BYTES = 65535


def log_topic(name: str) -> str | None:
    """The log topic of an MQTT topic name or filter, or None if it has none."""
    first = name.split("/", 1)[0]
    return first if LOG_TOPIC.fullmatch(first) else None


def valid_name(name: str) -> bool:
    """A topic name a client may PUBLISH to (4.7.3): non-empty, no wildcards, no NUL."""
    return bool(name) and "+" not in name and "#" not in name and "\x00" not in name


def valid_filter(text: str) -> bool:
    """A topic filter (4.7.1): ``#`` only last and alone in its level, ``+`` alone in its level."""
    if not text or "\x00" in text:
        return False
    levels = text.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def matches(topic_filter: str, name: str) -> bool:
    """Whether topic name ``name`` matches ``topic_filter`` (4.7.1)."""
    f_levels = topic_filter.split("/")
    n_levels = name.split("/")
    for i, f in enumerate(f_levels):
        if f == "#":
            return True  # also matches the parent level: "a/#" matches "a"
        if i >= len(n_levels) or (f != "+" and f != n_levels[i]):
            return False
    return len(f_levels) == len(n_levels)


def record_topic(log: str, key: bytes | None) -> str:
    """The MQTT topic name of a record of log topic ``log`` with ``key`` (see above)."""
    if key:
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError:
            return log
        if (name == log or name.startswith(log + "/")) and valid_name(name):
            return name
    return log
