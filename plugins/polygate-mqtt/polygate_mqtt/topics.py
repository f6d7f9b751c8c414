"""How MQTT topic names and filters map onto the log: the mapping an operator chooses.

Whatever the mapping, **the whole MQTT topic name is the record key**: the
gateway partitions by it (murmur2, as Kafka clients do), so one MQTT topic
keeps its order, and a Kafka, V1 or TANK reader sees it as the key. The
mapping only says which log topic a name goes to (``--codec-option
mqtt.mapping=...``, parsed once by ``parse_mapping``):

* ``per-level[:TOPIC]`` (the default): the first level of the name, when it is
  a log topic name (``[A-Za-z0-9._=-]{1,249}``); any other name (first level
  empty as in ``/a``, ``$``-names, spaces, non-ASCII...) goes to log topic
  ``TOPIC`` (default ``mqtt``).
* ``single[:TOPIC]``: every name goes to one log topic, ``TOPIC`` (default
  ``mqtt``), as Zilla does.
* ``rules:PATH``: a TOML file of ``[[rule]]`` tables, each a ``filter`` and the
  log ``topic`` its names go to; the first rule whose filter matches a name
  decides. A name no rule matches has no log topic: a PUBLISH there closes
  the connection (3.1.1 has no negative PUBACK) and a will there is refused.

Names under ``$SYS/`` are the gateway's own (``SYS_PREFIX``): they map to no
log topic under any mapping.

Reading, a filter reads the log topics its names may be in (``Mapping.sources``):
a fixed set, or, for a ``per-level`` filter whose first level is a wildcard,
every log topic, including those created later (``Sources.every``). A record
of log topic ``T`` is delivered under its key when the key is a UTF-8 topic
name that the mapping puts in ``T``; otherwise under the name ``T`` itself when
the mapping puts that name in ``T`` (``per-level``: a V1 or Kafka record of ``T``
is seen as topic ``T``); otherwise it is no MQTT message (``record_topic``).
So every message is delivered once, from the one log topic its name maps to.

Filters follow section 4.7: ``#`` (last, alone in its level) matches the rest
and the parent level, ``+`` one level, and a filter whose first level is a
wildcard matches no name that begins with ``$`` (4.7.2).
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Iterable

import attrs

LOG_TOPIC = re.compile(r"[A-Za-z0-9._=\-]{1,249}")
MAX_TOPIC_BYTES = 65535
DEFAULT_TOPIC = "mqtt"
SYS_PREFIX = "$SYS/"
RETAINED_TOPIC = "_mqtt_retained"
"""The last retained message of each MQTT topic name, keyed by it, in the ``mqtt`` format (a cleared
one: a tombstone, a null value), in a compacted log topic shared by every gateway of a cluster."""
SESSIONS_TOPIC = "_mqtt_sessions"
"""The persistent sessions, cluster-wide: one record per change of a session, keyed by the client
identifier, its value the session's subscriptions and what its positions' offsets do not say
(``session``); a session's group commits the offset of its record for partition 0. Compacted, one
partition."""
CLIENTS_TOPIC = "_mqtt_clients"
"""Which connection holds each client identifier, cluster-wide: one record per CONNECT, keyed by the
client identifier, its value the connection's name (``clients``); compacted, one partition."""
WILLS_TOPIC = "_mqtt_wills"
"""The delayed wills waiting for their time, cluster-wide, keyed by client identifier (``clients``):
a will, then the claim or the cancel that settles it, then a tombstone; compacted, one partition."""
_OWN = frozenset((RETAINED_TOPIC, SESSIONS_TOPIC, CLIENTS_TOPIC, WILLS_TOPIC))
MAX_CACHED_NAMES = 4096  # names whose log topic each mapping remembers: a publisher sends to few names


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


def wildcard_first(topic_filter: str) -> bool:
    """Whether the filter's first level is ``+`` or ``#`` (it then matches no ``$``-name)."""
    return topic_filter[:1] in ("+", "#") and topic_filter[1:2] in ("", "/")


def matches(topic_filter: str, name: str) -> bool:
    """Whether topic name ``name`` matches ``topic_filter`` (4.7.1, 4.7.2)."""
    if name[:1] == "$" and wildcard_first(topic_filter):
        return False
    f_levels = topic_filter.split("/")
    n_levels = name.split("/")
    for i, f in enumerate(f_levels):
        if f == "#":
            return True  # also matches the parent level: "a/#" matches "a"
        if i >= len(n_levels) or (f != "+" and f != n_levels[i]):
            return False
    return len(f_levels) == len(n_levels)


def overlaps(a: str, b: str) -> bool:
    """Whether some topic name matches both filters ``a`` and ``b``."""
    if wildcard_first(a) and b[:1] == "$" or wildcard_first(b) and a[:1] == "$":
        return False  # the other's names all begin with "$" (its first level is literal)
    la, lb = a.split("/"), b.split("/")
    for i in range(max(len(la), len(lb))):
        x: str | None = la[i] if i < len(la) else None
        y: str | None = lb[i] if i < len(lb) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if x != y and x != "+" and y != "+":
            return False
    return True


def is_sys(text: str) -> bool:
    """Whether a topic name or filter is under ``$SYS/``, the gateway's own figures."""
    return text.startswith(SYS_PREFIX) or text == "$SYS"


@attrs.frozen
class Sources:
    """The log topics a filter reads: ``topics``, and every other one too when ``every``."""

    topics: tuple[str, ...] = ()
    every: bool = False


def own(name: str) -> bool:
    """Whether a log topic is the gateway's own (the plugin's, or a Kafka-internal ``__`` one):
    no MQTT name is stored there, and no filter reads it."""
    return name in _OWN or name.startswith("__")


class Mapping:
    """Where a topic name is stored, and which log topics a filter reads (the module docstring)."""

    spec: str  # how the operator wrote it

    def log_topic(self, name: str) -> str | None:
        """The log topic of a valid topic name, or None if the mapping has none for it."""
        raise NotImplementedError

    def sources(self, topic_filter: str) -> Sources:
        """The log topics a valid filter's names may be in."""
        raise NotImplementedError

    def record_topic(self, log: str, key: bytes | None) -> str | None:
        """The MQTT topic name of a record of log topic ``log`` with ``key``, or None (not MQTT's)."""
        if key:
            try:
                name = key.decode("utf-8")
            except UnicodeDecodeError:
                name = ""
            if valid_name(name) and self.log_topic(name) == log:
                return name
        return log if self.log_topic(log) == log else None


class PerLevel(Mapping):
    """The first level when it is a log topic name, else ``other``."""

    def __init__(self, other: str = DEFAULT_TOPIC):
        self.other = other
        self.spec = "per-level" if other == DEFAULT_TOPIC else f"per-level:{other}"
        self.log_topic = functools.lru_cache(maxsize=MAX_CACHED_NAMES)(self._log_topic)  # type: ignore[method-assign]

    def _log_topic(self, name: str) -> str | None:
        if is_sys(name):
            return None
        first = name.split("/", 1)[0]
        return first if LOG_TOPIC.fullmatch(first) and not own(first) else self.other

    def sources(self, topic_filter: str) -> Sources:
        if wildcard_first(topic_filter):
            return Sources(every=True)
        first = topic_filter.split("/", 1)[0]
        return Sources((first if LOG_TOPIC.fullmatch(first) and not own(first) else self.other,))


class Single(Mapping):
    """Every name in one log topic."""

    def __init__(self, topic: str = DEFAULT_TOPIC):
        self.topic = topic
        self.spec = "single" if topic == DEFAULT_TOPIC else f"single:{topic}"

    def log_topic(self, name: str) -> str | None:
        return None if is_sys(name) else self.topic

    def sources(self, topic_filter: str) -> Sources:
        return Sources((self.topic,))


class Rules(Mapping):
    """The first of ``rules`` (``(filter, log topic)``) whose filter matches the name."""

    def __init__(self, rules: Iterable[tuple[str, str]], spec: str):
        self.rules = tuple(rules)
        self.spec = spec
        self.log_topic = functools.lru_cache(maxsize=MAX_CACHED_NAMES)(self._log_topic)  # type: ignore[method-assign]

    def _log_topic(self, name: str) -> str | None:
        if is_sys(name):
            return None
        return next((topic for rule, topic in self.rules if matches(rule, name)), None)

    def sources(self, topic_filter: str) -> Sources:
        if valid_name(topic_filter):  # no wildcard: the one name's topic
            topic = self.log_topic(topic_filter)
            return Sources(() if topic is None else (topic,))
        return Sources(tuple(dict.fromkeys(topic for rule, topic in self.rules if overlaps(rule, topic_filter))))


def _log_topic_name(text: str) -> str:
    if not LOG_TOPIC.fullmatch(text) or own(text):
        raise ValueError(f"{text!r} is not a log topic name [A-Za-z0-9._=-]{{1,249}} of its own")
    return text


def parse_mapping(text: str) -> Mapping:
    """The ``mapping`` option: ``per-level[:TOPIC]``, ``single[:TOPIC]`` or ``rules:PATH`` (the
    file is read now, so that a bad one stops the gateway from starting); ``ValueError`` if bad."""
    kind, _, arg = text.strip().partition(":")
    if kind == "per-level":
        return PerLevel(_log_topic_name(arg) if arg else DEFAULT_TOPIC)
    if kind == "single":
        return Single(_log_topic_name(arg) if arg else DEFAULT_TOPIC)
    if kind == "rules" and arg:
        try:
            with open(arg, "rb") as f:
                table = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ValueError(f"rules file {arg}: {e}") from None
        rules = []
        for rule in table.get("rule", ()):
            topic_filter, topic = rule.get("filter"), rule.get("topic")
            if not isinstance(topic_filter, str) or not valid_filter(topic_filter) or is_sys(topic_filter):
                raise ValueError(f"rules file {arg}: rule filter {topic_filter!r} is not a topic filter outside $SYS")
            if not isinstance(topic, str):
                raise ValueError(f"rules file {arg}: rule for {topic_filter!r} has no topic")
            rules.append((topic_filter, _log_topic_name(topic)))
        if not rules:
            raise ValueError(f"rules file {arg}: no [[rule]]")
        return Rules(rules, text.strip())
    raise ValueError(text)
