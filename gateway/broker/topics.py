"""Topic commands and admin: create, delete, add partitions, list; server info; and the
partitions each principal created (``Creations``, ``--max-partitions-per-principal``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet import defer

from gateway import model as m
from gateway.broker.calls import errors_as, then
from gateway.broker.configs import change_list
from gateway.codec import topic_configs
from gateway.model import CommandError, Error, ErrorCode

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.storage.interface import MayWait

log = logging.getLogger(__name__)


class Creations:
    """The partitions each principal created, against its quota (``limit``, 0: none).

    Only a produce to a missing topic (V1, MQTT; Kafka's producers through a Metadata request
    that allows it, as in Kafka), CreateTopic and CreatePartitions create; a subscription, a
    consume or a group join never does. A principal is its
    name, and an anonymous caller its name and address (anonymous clients are not one
    client). A creation is refused when the principal's partitions and the new ones would
    pass the quota (a topic created by a produce, whose partitions are the store's default,
    once they reached it); what it created is charged once created, and refunded when the
    topic is deleted. Kept in memory: after a restart the count starts over, from the partitions
    created since (so a restart never refuses less than before)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used: dict[str, int] = {}
        self._charged: dict[str, dict[str, int]] = {}  # topic -> {principal: its partitions}

    @staticmethod
    def principal(caller: m.Caller) -> str:
        return f"{caller.principal}@{caller.host}" if caller.principal == m.ANONYMOUS else caller.principal

    def check(self, caller: m.Caller, partitions: int) -> None:
        """Raise ``INVALID_REQUEST`` if ``caller`` may not create ``partitions`` more."""
        who = self.principal(caller)
        used = self.used.get(who, 0)
        if self.limit and used + partitions > self.limit:
            raise CommandError(ErrorCode.INVALID_REQUEST,
                               f"{who} created {used} partitions: creating {partitions} more would pass its quota "
                               f"of {self.limit} (--max-partitions-per-principal)")

    def charge(self, caller: m.Caller, topic: str, partitions: int) -> None:
        who = self.principal(caller)
        self.used[who] = self.used.get(who, 0) + partitions
        charged = self._charged.setdefault(topic, {})
        charged[who] = charged.get(who, 0) + partitions

    def refund(self, topic: str) -> None:
        """``topic`` is deleted: its partitions count for nobody any more."""
        for who, partitions in self._charged.pop(topic, {}).items():
            left = self.used.get(who, 0) - partitions
            if left > 0:
                self.used[who] = left
            else:
                self.used.pop(who, None)


class Topics:
    def __init__(self, broker: Broker):
        self.broker = broker
        self.store = broker.store
        self.creations = Creations(broker.config.max_partitions_per_principal)

    def ensure(self, topic: str, auto_create: bool) -> Any:
        """Create ``topic`` with the default partition count when it is missing, the
        command asks for it and the broker allows it, within the caller's quota
        (``Creations``): None, or a Deferred of the creation.

        A topic someone else created meanwhile (another gateway on the same
        cluster) counts as created. An internal topic (``m.INTERNAL_TOPICS``) is never
        created so: ``INVALID_TOPIC``."""
        if auto_create and self.broker.config.auto_create_topics and not self.store.has_topic(topic):
            m.check_appendable(topic)
            caller = self.broker.caller
            self.creations.check(caller, 1)
            log.info("topic %s: created on first use by %s", topic, Creations.principal(caller))
            created = then(self.store.create_topic(topic), lambda info: self._charge(caller, info))
            if isinstance(created, defer.Deferred):
                return created.addErrback(_exists_is_enough)
            return created
        return None

    def _charge(self, caller: m.Caller, info: m.TopicInfo) -> m.TopicInfo:
        self.creations.charge(caller, info.topic, len(info.partitions))
        return info

    def missing(self, topic: str, partition: int) -> Error | None:
        """Why ``topic``/``partition`` does not exist (``UNKNOWN_TOPIC``, ``UNKNOWN_PARTITION``), or
        None: it does."""
        try:
            count = self.store.partition_count(topic)
        except CommandError as e:
            return e.error
        return None if 0 <= partition < count else Error(ErrorCode.UNKNOWN_PARTITION,
                                                         f"unknown partition {topic}/{partition}")

    @errors_as(m.CreateTopicResult, "topic")
    def create(self, cmd: m.CreateTopic) -> MayWait[m.CreateTopicResult]:
        caller = self.broker.caller
        if cmd.if_not_exists and self.store.has_topic(cmd.topic):
            existing = self.store.describe_topic(cmd.topic)
            if cmd.partitions and cmd.partitions > len(existing.partitions):
                return self._grow(caller, cmd.topic, len(existing.partitions), cmd.partitions, self._created)
            return self._created(existing)
        self.creations.check(caller, cmd.partitions or 1)

        def created(info: m.TopicInfo) -> MayWait[m.CreateTopicResult]:
            log.info("topic %s: created with %d partitions by %s", info.topic, len(info.partitions),
                     Creations.principal(caller))
            return self._created(self._charge(caller, info))

        return then(self.store.create_topic(cmd.topic, cmd.partitions, cmd.config), created)

    def _grow(self, caller: m.Caller, topic: str, had: int, total: int, done: Any) -> Any:
        """Grow ``topic`` from ``had`` to ``total`` partitions, within the caller's quota; ``done(info)``."""
        self.creations.check(caller, total - had)

        def grown(info: m.TopicInfo) -> Any:
            self.creations.charge(caller, topic, len(info.partitions) - had)
            return done(info)

        return then(self.store.add_partitions(topic, total), grown)

    def _created(self, info: m.TopicInfo) -> MayWait[m.CreateTopicResult]:
        return self.broker.durable(m.CreateTopicResult(info.topic, len(info.partitions), config=info.config,
                                                         topic_id=info.topic_id))

    @errors_as(m.DeleteTopicResult, "topic")
    def delete(self, cmd: m.DeleteTopic) -> MayWait[m.DeleteTopicResult]:
        def deleted(_: None) -> MayWait[m.DeleteTopicResult]:
            log.info("topic %s: deleted", cmd.topic)
            self.creations.refund(cmd.topic)
            self.broker.cache.clear()
            return self.broker.durable(m.DeleteTopicResult(cmd.topic))

        return then(self.store.delete_topic(cmd.topic), deleted)

    @errors_as(m.CreatePartitionsResult, "topic")
    def create_partitions(self, cmd: m.CreatePartitions) -> MayWait[m.CreatePartitionsResult]:
        had = self.store.partition_count(cmd.topic)
        return self._grow(self.broker.caller, cmd.topic, had, max(cmd.count, had),
                          lambda _: self.broker.durable(m.CreatePartitionsResult(cmd.topic)))

    @errors_as(m.DeleteRecordsResult, "topic", "partition")
    def delete_records(self, cmd: m.DeleteRecords) -> MayWait[m.DeleteRecordsResult]:
        """Move the log start to ``cmd.offset`` (-1: the high watermark); any other offset below 0
        is out of range, as past the high watermark (which the store refuses), as Kafka answers."""
        if cmd.offset == m.DeleteRecords.HIGH_WATERMARK:
            offset = self.store.high_watermark(cmd.topic, cmd.partition)
        elif cmd.offset < 0:
            raise CommandError(ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {cmd.offset} is not a partition's offset")
        else:
            offset = cmd.offset

        def deleted(start: int) -> MayWait[m.DeleteRecordsResult]:
            log.info("topic %s/%d: records before %d deleted", cmd.topic, cmd.partition, start)
            self.broker.cache.clear()
            return self.broker.durable(m.DeleteRecordsResult(cmd.topic, cmd.partition, start))

        return then(self.store.delete_records(cmd.topic, cmd.partition, offset), deleted)

    def describe_configs(self, cmd: m.DescribeConfigs) -> m.DescribeConfigsResult:
        defaults = self.store.topic_defaults()
        out = []
        for topic in cmd.topics:
            try:
                config = self.store.describe_topic(topic).config
            except CommandError as e:
                out.append(m.TopicSettings(topic, error=e.error))
                continue
            out.append(m.TopicSettings(topic, tuple(topic_configs.describe(config, defaults))))
        return m.DescribeConfigsResult(tuple(out))

    @errors_as(m.AlterConfigsResult, "topic")
    def alter_configs(self, cmd: m.AlterConfigs) -> MayWait[m.AlterConfigsResult]:
        current = self.store.describe_topic(cmd.topic).config
        base = m.TopicConfig(replication_factor=current.replication_factor) if cmd.replace else current
        changes: dict[str, str | None] = {}
        for name, operation, value in cmd.changes:
            if operation in ("append", "subtract"):
                value = _list_change(name, operation, value, changes.get(name, _text_of(base, name)))
            elif operation == "delete":
                value = None
            elif operation != "set":
                raise CommandError(ErrorCode.INVALID_REQUEST, f"unknown config operation {operation!r}")
            changes[name] = value
        config = topic_configs.apply(base, changes)
        if cmd.validate_only or config == current:
            return m.AlterConfigsResult(cmd.topic)

        def altered(_: m.TopicInfo) -> MayWait[m.AlterConfigsResult]:
            log.info("topic %s: settings now %s", cmd.topic, topic_configs.changes_of(config) or "the defaults")
            return self.broker.durable(m.AlterConfigsResult(cmd.topic))

        return then(self.store.alter_topic_config(cmd.topic, config), altered)

    def list(self, cmd: m.ListTopics) -> Any:
        """The topics named (all of them for ``None``), the missing ones created first when the
        command asks for it (``m.ListTopics.auto_create``). Kafka's internal topics
        (``m.INTERNAL_TOPICS``), which no client may write, are ``INVALID_TOPIC`` rather than
        unknown, so that a producer learns it at once, as from Kafka."""
        names = sorted(self.store.topic_names()) if cmd.topics is None else cmd.topics
        infos = [self._listed(name, cmd.auto_create) for name in names]
        if any(isinstance(i, defer.Deferred) for i in infos):
            return defer.gatherResults([i if isinstance(i, defer.Deferred) else defer.succeed(i) for i in infos],
                                       consumeErrors=True).addCallback(lambda infos: m.ListTopicsResult(tuple(infos)))
        return m.ListTopicsResult(tuple(infos))

    def _listed(self, name: str, auto_create: bool) -> Any:
        """The topic's ``TopicInfo`` (created first if asked and allowed), errors included."""
        try:
            m.check_appendable(name)
            ensured = self.ensure(name, auto_create)
        except CommandError as e:
            return m.TopicInfo(name, error=e.error)
        if isinstance(ensured, defer.Deferred):
            def failed(f: Any) -> m.TopicInfo:
                f.trap(CommandError)
                return m.TopicInfo(name, error=f.value.error)

            return ensured.addCallbacks(lambda _: self._describe(name), failed)
        return self._describe(name)

    def _describe(self, name: str) -> m.TopicInfo:
        """The topic as readers see it: a partition's high watermark is its last stable offset
        (where an open transaction's records begin), the end of what every protocol but Kafka
        (which asks for offsets itself, with its isolation level) may read."""
        try:
            info = self.store.describe_topic(name)
        except CommandError as e:
            return m.TopicInfo(name, error=e.error)
        txns = self.broker.transactions
        if not txns.open_on:
            return info
        return attrs.evolve(info, partitions=tuple(
            attrs.evolve(p, high_watermark=txns.last_stable_offset(name, p.partition, p.high_watermark))
            for p in info.partitions))

    def server_info(self, cmd: m.ServerInfo) -> m.ServerInfoResult:
        return m.ServerInfoResult(self.store.started_at, len(self.store.topic_names()),
                                  self.store.total_partitions(), self.broker.listeners)


def _text_of(config: m.TopicConfig, name: str) -> str | None:
    """The text of setting ``name`` that ``config`` sets, None where it leaves the default."""
    return topic_configs.changes_of(config).get(name, config.extras.get(name))


def _list_change(name: str, operation: str, value: str | None, current: str | None) -> str | None:
    """A list setting (``cleanup.policy``) with ``value``'s items appended or subtracted."""
    if name != "cleanup.policy":
        raise CommandError(ErrorCode.INVALID_CONFIG, f"{name} is not a list: {operation} applies to cleanup.policy")
    return change_list(current or "delete", operation, value)


def _exists_is_enough(f: Any) -> None:
    f.trap(CommandError)
    if f.value.error.code != m.ErrorCode.TOPIC_EXISTS:
        return f
    return None
