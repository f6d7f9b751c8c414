"""Topic commands and admin: create, delete, add partitions, list; server info."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet import defer

from gateway import model as m
from gateway.broker.calls import errors_as, then
from gateway.codec import topic_configs
from gateway.model import CommandError, ErrorCode

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.storage.interface import MayWait

log = logging.getLogger(__name__)


class Topics:
    def __init__(self, broker: Broker):
        self.broker = broker
        self.store = broker.store

    def ensure(self, topic: str, auto_create: bool) -> Any:
        """Create ``topic`` with the default partition count when it is missing, the
        command asks for it and the broker allows it: None, or a Deferred of the creation.

        A topic someone else created meanwhile (another gateway on the same
        cluster) counts as created."""
        if auto_create and self.broker.config.auto_create_topics and not self.store.has_topic(topic):
            log.info("topic %s: created on first use", topic)
            created = self.store.create_topic(topic)
            if isinstance(created, defer.Deferred):
                return created.addErrback(_exists_is_enough)
            return created
        return None

    @errors_as(m.CreateTopicResult, "topic")
    def create(self, cmd: m.CreateTopic) -> MayWait[m.CreateTopicResult]:
        if cmd.if_not_exists and self.store.has_topic(cmd.topic):
            existing = self.store.describe_topic(cmd.topic)
            if cmd.partitions and cmd.partitions > len(existing.partitions):
                return then(self.store.add_partitions(cmd.topic, cmd.partitions), self._created)
            return self._created(existing)

        def created(info: m.TopicInfo) -> MayWait[m.CreateTopicResult]:
            log.info("topic %s: created with %d partitions", info.topic, len(info.partitions))
            return self._created(info)

        return then(self.store.create_topic(cmd.topic, cmd.partitions, cmd.config), created)

    def _created(self, info: m.TopicInfo) -> MayWait[m.CreateTopicResult]:
        return self.broker.durable(m.CreateTopicResult(info.topic, len(info.partitions), config=info.config,
                                                         topic_id=info.topic_id))

    @errors_as(m.DeleteTopicResult, "topic")
    def delete(self, cmd: m.DeleteTopic) -> MayWait[m.DeleteTopicResult]:
        def deleted(_: None) -> MayWait[m.DeleteTopicResult]:
            log.info("topic %s: deleted", cmd.topic)
            self.broker.cache.clear()
            return self.broker.durable(m.DeleteTopicResult(cmd.topic))

        return then(self.store.delete_topic(cmd.topic), deleted)

    @errors_as(m.CreatePartitionsResult, "topic")
    def create_partitions(self, cmd: m.CreatePartitions) -> MayWait[m.CreatePartitionsResult]:
        return then(self.store.add_partitions(cmd.topic, cmd.count),
                    lambda _: self.broker.durable(m.CreatePartitionsResult(cmd.topic)))

    @errors_as(m.DeleteRecordsResult, "topic", "partition")
    def delete_records(self, cmd: m.DeleteRecords) -> MayWait[m.DeleteRecordsResult]:
        offset = cmd.offset if cmd.offset >= 0 else self.store.high_watermark(cmd.topic, cmd.partition)

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
        names = sorted(self.store.topic_names()) if cmd.topics is None else cmd.topics
        infos = [self._info(name, cmd.auto_create) for name in names]
        if any(isinstance(i, defer.Deferred) for i in infos):
            return defer.gatherResults([i if isinstance(i, defer.Deferred) else defer.succeed(i) for i in infos],
                                       consumeErrors=True).addCallback(lambda infos: m.ListTopicsResult(tuple(infos)))
        return m.ListTopicsResult(tuple(infos))

    def _info(self, name: str, auto_create: bool) -> Any:
        """The topic's ``TopicInfo`` (created first if asked and allowed), errors included."""
        try:
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
    items = [i for i in (current or "delete").split(",") if i]
    for item in (value or "").split(","):
        if operation == "append" and item and item not in items:
            items.append(item)
        elif operation == "subtract" and item in items:
            items.remove(item)
    return ",".join(items) if items else None


def _exists_is_enough(f: Any) -> None:
    f.trap(CommandError)
    if f.value.error.code != m.ErrorCode.TOPIC_EXISTS:
        return f
    return None
