"""ACL enforcement (``--authorizer acl``): every command of every protocol, checked once, here.

``Access.run(command, caller)`` runs a command as ``caller`` would be allowed to:
the whole command, a part of it, or nothing, answering what is refused with
the error of the resource that refused it (``TOPIC_AUTHORIZATION``,
``GROUP_AUTHORIZATION``, ``CLUSTER_AUTHORIZATION``,
``TRANSACTIONAL_ID_AUTHORIZATION``), which each codec turns into its own.
What each command needs follows Kafka's authorizer:

=====================  ==================================================================
Produce                Write on the topic (and Create, below, to create it)
Fetch, FetchMany       Read on each topic; a refused partition gets the error, the rest run;
                       a Fetch that starts at a group's committed offset also needs Describe
                       on the group (reading that offset, as OffsetFetch does)
ListOffsets,           Describe on the topic
OffsetForLeaderEpoch
CreateTopic            Create on the cluster or on the topic
DeleteTopic            Delete on the topic
CreatePartitions       Alter on the topic
DeleteRecords          Delete on the topic
DescribeConfigs        DescribeConfigs on each topic (the others answered with the error)
AlterConfigs           AlterConfigs on the topic
DescribeBrokerConfigs  DescribeConfigs on the cluster
AlterBrokerConfigs     AlterConfigs on the cluster
ListTopics             Describe (Read, for ``read``) on each topic: a listing of all leaves
                       out the others, a named one is answered with the error;
                       auto-creation needs Create
Join/Sync/Heartbeat/   Read on the group
Leave, ConsumerGroup-
Heartbeat
CommitOffsets          Read on the group, and Read on each topic (per-partition errors)
FetchOffsets           Describe on the group; partitions of topics without Describe are left out
DescribeGroups         Describe on each group
ListGroups             Describe on the cluster, or else the groups the caller may Describe
DeleteGroups           Delete on each group
DeleteOffsets          Delete on the group, and Read on each topic (per-partition errors)
InitProducerId         Write on the transactional id; without one, IdempotentWrite on the
                       cluster or Write on some topic
AddPartitionsToTxn     Write on the transactional id, and Write on each topic (a refused
                       topic fails the whole request, as Kafka's)
AddOffsetsToTxn,       Write on the transactional id, and Read on the group
TxnOffsetCommit
EndTxn                 Write on the transactional id
ListTransactions,      Describe on each transactional id (the others are left out, or
DescribeTransactions   answered with the error)
DescribeProducers      Read on each topic
ReplicaProgress,       ClusterAction on the cluster (V1 replication)
SetPartitionRole
Create/DeleteAcls,     Alter on the cluster
AlterUsers
DescribeAcls,          Describe on the cluster
DescribeUsers
AuthorizedOperations   nothing: it answers which operations the caller may perform
Ping, ServerInfo       nothing
=====================  ==================================================================

Produces that are allowed still share appends (``Broker.run_many``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet import defer

from gateway import model as m
from gateway.broker.calls import then
from gateway.model import AclOperation as Op
from gateway.model import ErrorCode, ResourceType
from gateway.security.acl import Acls

if TYPE_CHECKING:
    from gateway.broker import Broker

_DENIED = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION,
}


def denied(resource_type: ResourceType, name: str, operation: Op) -> m.Error:
    """The error of a refused ``operation``; it names what was refused, and for whom not."""
    what = "the cluster" if resource_type is ResourceType.CLUSTER else f"{resource_type.name.lower()} {name!r}"
    return m.Error(_DENIED[resource_type], f"not authorized to {operation.name.lower()} {what}")


class Access:
    """Runs commands on ``broker`` as a caller the ACLs in ``acls`` allow."""

    def __init__(self, broker: Broker, acls: Acls):
        self.broker = broker
        self.acls = acls
        self._rules: dict[type, Callable[[Any, m.Caller], Any]] = {
            m.Produce: self._produce,
            m.Fetch: self._fetch,
            m.FetchMany: self._fetch_many,
            m.ListOffsets: self._topic_rule(Op.DESCRIBE, lambda c, e: m.ListOffsetsResult(c.topic, c.partition,
                                                                                         error=e)),
            m.OffsetForLeaderEpoch: self._topic_rule(Op.DESCRIBE, lambda c, e: m.OffsetForLeaderEpochResult(
                c.topic, c.partition, error=e)),
            m.CreateTopic: self._create_topic,
            m.DeleteTopic: self._topic_rule(Op.DELETE, lambda c, e: m.DeleteTopicResult(c.topic, e)),
            m.CreatePartitions: self._topic_rule(Op.ALTER, lambda c, e: m.CreatePartitionsResult(c.topic, e)),
            m.ListTopics: self._list_topics,
            m.DescribeConfigs: self._describe_configs,
            m.DeleteRecords: self._topic_rule(Op.DELETE, lambda c, e: m.DeleteRecordsResult(c.topic, c.partition,
                                                                                             error=e)),
            m.AlterConfigs: self._topic_rule(Op.ALTER_CONFIGS, lambda c, e: m.AlterConfigsResult(c.topic, e)),
            m.DescribeBrokerConfigs: self._cluster_rule(Op.DESCRIBE_CONFIGS,
                                                        lambda c, e: m.DescribeBrokerConfigsResult(error=e)),
            m.AlterBrokerConfigs: self._cluster_rule(Op.ALTER_CONFIGS, lambda c, e: m.AlterBrokerConfigsResult(e)),
            m.JoinGroup: self._group_rule(Op.READ, lambda c, e: m.JoinGroupResult(c.group, c.member_id, error=e)),
            m.SyncGroup: self._group_rule(Op.READ, lambda c, e: m.SyncGroupResult(c.group, error=e)),
            m.Heartbeat: self._group_rule(Op.READ, lambda c, e: m.HeartbeatResult(c.group, e)),
            m.LeaveGroup: self._group_rule(Op.READ, lambda c, e: m.LeaveGroupResult(c.group, e)),
            m.ConsumerGroupHeartbeat: self._group_rule(Op.READ, lambda c, e: m.ConsumerGroupHeartbeatResult(
                c.group, c.member_id, error=e)),
            m.CommitOffsets: self._commit_offsets,
            m.FetchOffsets: self._fetch_offsets,
            m.DescribeGroups: self._describe_groups,
            m.ListGroups: self._list_groups,
            m.DeleteGroups: self._delete_groups,
            m.DeleteOffsets: self._delete_offsets,
            m.InitProducerId: self._init_producer_id,
            m.ReplicaProgress: self._cluster_rule(Op.CLUSTER_ACTION, lambda c, e: m.ReplicaProgressResult(
                c.topic, c.partition, c.replica_id, error=e)),
            m.SetPartitionRole: self._cluster_rule(Op.CLUSTER_ACTION, lambda c, e: m.SetPartitionRoleResult(
                c.topic, c.partition, error=e)),
            m.CreateAcls: self._cluster_rule(Op.ALTER, lambda c, e: m.CreateAclsResult((e,) * len(c.bindings))),
            m.DeleteAcls: self._cluster_rule(Op.ALTER, lambda c, e: m.DeleteAclsResult((((), e),) * len(c.filters))),
            m.AlterUsers: self._cluster_rule(Op.ALTER, lambda c, e: m.AlterUsersResult(tuple(
                (u, e) for u in dict.fromkeys([u for u, *_ in c.upsertions] + [u for u, _ in c.deletions])))),
            m.DescribeAcls: self._cluster_rule(Op.DESCRIBE, lambda c, e: m.DescribeAclsResult(error=e)),
            m.DescribeUsers: self._cluster_rule(Op.DESCRIBE, lambda c, e: m.DescribeUsersResult(error=e)),
            m.AuthorizedOperations: self._authorized_operations,
            m.Ping: self._anyone,
            m.ServerInfo: self._anyone,
            m.AddPartitionsToTxn: self._add_partitions_to_txn,
            m.AddOffsetsToTxn: self._txn_and_group(lambda c, e: m.TxnResult(e)),
            m.TxnOffsetCommit: self._txn_and_group(lambda c, e: m.TxnOffsetCommitResult(error=e)),
            m.EndTxn: self._rule(ResourceType.TRANSACTIONAL_ID, Op.WRITE, lambda c, e: m.TxnResult(e)),
            m.ListTransactions: self._list_transactions,
            m.DescribeTransactions: self._describe_transactions,
            m.DescribeProducers: self._describe_producers,
        }

    def may(self, caller: m.Caller, operation: Op, resource_type: ResourceType, name: str) -> bool:
        return self.acls.allowed(caller.principal, caller.host, operation, resource_type, name)

    def _authorized_operations(self, cmd: m.AuthorizedOperations, caller: m.Caller) -> m.AuthorizedOperationsResult:
        supported = m.SUPPORTED_OPERATIONS[cmd.resource_type]
        return m.AuthorizedOperationsResult(tuple(
            tuple(op for op in supported if self.may(caller, op, cmd.resource_type, name)) for name in cmd.names))

    # ------------------------------------------------------------------ running

    def run(self, command: Any, caller: m.Caller) -> Any:
        """``command``'s result as ``caller`` may have it (or a Deferred of it)."""
        rule = self._rules.get(type(command))
        if rule is None:  # a command nobody thought of is refused, not run
            raise TypeError(f"no access rule for {type(command).__name__}")
        return rule(command, caller)

    def run_many(self, commands: Sequence[Any], caller: m.Caller) -> list[Any]:
        """``[run(c, caller) for c in commands]``, in order; consecutive allowed produces
        go to ``Broker.run_many`` together, so that they share appends."""
        results: list[Any] = []
        produces: list[Any] = []
        for command in commands:
            if type(command) is m.Produce and self._may_produce(command, caller):
                produces.append(self._without_refused_creation(command, caller))
                continue
            if produces:
                results.extend(self.broker.run_many_unchecked(produces))
                produces = []
            try:
                results.append(self.run(command, caller))
            except Exception:
                results.append(defer.fail())
        if produces:
            results.extend(self.broker.run_many_unchecked(produces))
        return results

    # ------------------------------------------------------------------ rules by resource

    def _anyone(self, cmd: Any, caller: m.Caller) -> Any:
        return self.broker.run(cmd)

    def _rule(self, resource_type: ResourceType, operation: Op,
              refuse: Callable[[Any, m.Error], Any]) -> Callable[[Any, m.Caller], Any]:
        """The rule of a command on one resource of ``resource_type`` (the command's topic or
        group, or the cluster): run it if ``operation`` is allowed, else ``refuse(cmd, error)``."""
        def name_of(cmd: Any) -> str:
            if resource_type is ResourceType.TOPIC:
                return cmd.topic
            if resource_type is ResourceType.TRANSACTIONAL_ID:
                return cmd.transactional_id
            return cmd.group if resource_type is ResourceType.GROUP else m.CLUSTER_RESOURCE

        def rule(cmd: Any, caller: m.Caller) -> Any:
            name = name_of(cmd)
            if self.may(caller, operation, resource_type, name):
                return self.broker.run(cmd)
            return refuse(cmd, denied(resource_type, name, operation))
        return rule

    def _topic_rule(self, operation: Op, refuse: Callable[[Any, m.Error], Any]) -> Callable[[Any, m.Caller], Any]:
        return self._rule(ResourceType.TOPIC, operation, refuse)

    def _group_rule(self, operation: Op, refuse: Callable[[Any, m.Error], Any]) -> Callable[[Any, m.Caller], Any]:
        return self._rule(ResourceType.GROUP, operation, refuse)

    def _cluster_rule(self, operation: Op, refuse: Callable[[Any, m.Error], Any]) -> Callable[[Any, m.Caller], Any]:
        return self._rule(ResourceType.CLUSTER, operation, refuse)

    # ------------------------------------------------------------------ topics and data

    def _may_create(self, caller: m.Caller, topic: str) -> bool:
        return (self.may(caller, Op.CREATE, ResourceType.CLUSTER, m.CLUSTER_RESOURCE)
                or self.may(caller, Op.CREATE, ResourceType.TOPIC, topic))

    def _may_produce(self, cmd: m.Produce, caller: m.Caller) -> bool:
        return self.may(caller, Op.WRITE, ResourceType.TOPIC, cmd.topic)

    def _without_refused_creation(self, cmd: Any, caller: m.Caller) -> Any:
        """``cmd``, asking to create its topic only if the caller may create it."""
        if cmd.auto_create and not self.broker.store.has_topic(cmd.topic) and not self._may_create(caller, cmd.topic):
            return attrs.evolve(cmd, auto_create=False)
        return cmd

    def _produce(self, cmd: m.Produce, caller: m.Caller) -> Any:
        if self._may_produce(cmd, caller):
            return self.broker.run(self._without_refused_creation(cmd, caller))
        return m.ProduceResult(cmd.topic, -1 if cmd.partition is None else cmd.partition,
                               error=denied(ResourceType.TOPIC, cmd.topic, Op.WRITE))

    def _fetch(self, cmd: m.Fetch, caller: m.Caller) -> Any:
        if not self.may(caller, Op.READ, ResourceType.TOPIC, cmd.topic):
            return m.FetchResult(cmd.topic, cmd.partition, error=denied(ResourceType.TOPIC, cmd.topic, Op.READ))
        if cmd.group is not None and not self.may(caller, Op.DESCRIBE, ResourceType.GROUP, cmd.group):
            return m.FetchResult(cmd.topic, cmd.partition, error=denied(ResourceType.GROUP, cmd.group, Op.DESCRIBE))
        return self.broker.run(cmd)

    def _fetch_many(self, cmd: m.FetchMany, caller: m.Caller) -> Any:
        refused = {i: m.FetchResult(f.topic, f.partition, error=denied(ResourceType.TOPIC, f.topic, Op.READ))
                   for i, f in enumerate(cmd.fetches) if not self.may(caller, Op.READ, ResourceType.TOPIC, f.topic)}
        if not refused:
            return self.broker.run(cmd)
        allowed = tuple(f for i, f in enumerate(cmd.fetches) if i not in refused)
        if not allowed:
            return m.FetchManyResult(tuple(refused.values()))

        def merge(result: m.FetchManyResult) -> m.FetchManyResult:
            ran = iter(result.results)
            return m.FetchManyResult(tuple(refused[i] if i in refused else next(ran) for i in range(len(cmd.fetches))))

        return then(self.broker.run(attrs.evolve(cmd, fetches=allowed)), merge)

    def _create_topic(self, cmd: m.CreateTopic, caller: m.Caller) -> Any:
        if self._may_create(caller, cmd.topic):
            return self.broker.run(cmd)
        return m.CreateTopicResult(cmd.topic, error=denied(ResourceType.TOPIC, cmd.topic, Op.CREATE))

    def _list_topics(self, cmd: m.ListTopics, caller: m.Caller) -> Any:
        operation = Op.READ if cmd.read else Op.DESCRIBE

        def describable(name: str) -> bool:
            return self.may(caller, operation, ResourceType.TOPIC, name)

        topics = cmd.topics
        if topics is None:
            return then(self.broker.run(cmd), lambda r: m.ListTopicsResult(
                tuple(t for t in r.topics if describable(t.topic))))
        refused = {name: m.TopicInfo(name, error=denied(ResourceType.TOPIC, name, operation))
                   for name in topics if not describable(name)}
        allowed = tuple(name for name in topics if name not in refused)
        if not allowed:
            return m.ListTopicsResult(tuple(refused[n] for n in topics))
        auto_create = cmd.auto_create and all(
            self.broker.store.has_topic(n) or self._may_create(caller, n) for n in allowed)
        ran = self.broker.run(m.ListTopics(allowed, read=cmd.read, auto_create=auto_create))

        def merge(result: m.ListTopicsResult) -> m.ListTopicsResult:
            by_name = {t.topic: t for t in result.topics}
            return m.ListTopicsResult(tuple(refused.get(n) or by_name[n] for n in topics if n in refused
                                            or n in by_name))

        return then(ran, merge)

    # ------------------------------------------------------------------ groups

    def _commit_offsets(self, cmd: m.CommitOffsets, caller: m.Caller) -> Any:
        if not self.may(caller, Op.READ, ResourceType.GROUP, cmd.group):
            error = denied(ResourceType.GROUP, cmd.group, Op.READ)
            return m.CommitOffsetsResult(cmd.group, tuple((t, p, error) for t, p, _, _ in cmd.offsets), error)
        refused = {(t, p): denied(ResourceType.TOPIC, t, Op.READ) for t, p, _, _ in cmd.offsets
                   if not self.may(caller, Op.READ, ResourceType.TOPIC, t)}
        if not refused:
            return self.broker.run(cmd)
        allowed = tuple(o for o in cmd.offsets if (o[0], o[1]) not in refused)
        topic_error = next(iter(refused.values()))
        if not allowed:
            return m.CommitOffsetsResult(cmd.group, tuple((t, p, e) for (t, p), e in refused.items()), topic_error)

        def merge(result: m.CommitOffsetsResult) -> m.CommitOffsetsResult:
            return attrs.evolve(result, errors=result.errors + tuple((t, p, e) for (t, p), e in refused.items()),
                                error=result.error or topic_error)

        return then(self.broker.run(attrs.evolve(cmd, offsets=allowed)), merge)

    def _fetch_offsets(self, cmd: m.FetchOffsets, caller: m.Caller) -> Any:
        if not self.may(caller, Op.DESCRIBE, ResourceType.GROUP, cmd.group):
            return m.FetchOffsetsResult(cmd.group, error=denied(ResourceType.GROUP, cmd.group, Op.DESCRIBE))

        def visible(result: m.FetchOffsetsResult) -> m.FetchOffsetsResult:
            return attrs.evolve(result, offsets=tuple(
                o for o in result.offsets if self.may(caller, Op.DESCRIBE, ResourceType.TOPIC, o[0])))

        return then(self.broker.run(cmd), visible)

    def _describe_groups(self, cmd: m.DescribeGroups, caller: m.Caller) -> Any:
        allowed = tuple(g for g in cmd.groups if self.may(caller, Op.DESCRIBE, ResourceType.GROUP, g))

        def merge(result: m.DescribeGroupsResult | None) -> m.DescribeGroupsResult:
            by_name = {g.group: g for g in (result.groups if result else ())}
            return m.DescribeGroupsResult(tuple(
                by_name[g] if g in by_name else m.GroupInfo(g, "", error=denied(ResourceType.GROUP, g, Op.DESCRIBE))
                for g in cmd.groups))

        if not allowed:
            return merge(None)
        return then(self.broker.run(m.DescribeGroups(allowed)), merge)

    def _list_groups(self, cmd: m.ListGroups, caller: m.Caller) -> Any:
        if self.may(caller, Op.DESCRIBE, ResourceType.CLUSTER, m.CLUSTER_RESOURCE):
            return self.broker.run(cmd)
        return then(self.broker.run(cmd), lambda r: m.ListGroupsResult(tuple(
            g for g in r.groups if self.may(caller, Op.DESCRIBE, ResourceType.GROUP, g.group))))

    def _delete_groups(self, cmd: m.DeleteGroups, caller: m.Caller) -> Any:
        allowed = tuple(g for g in cmd.groups if self.may(caller, Op.DELETE, ResourceType.GROUP, g))

        def merge(result: m.DeleteGroupsResult | None) -> m.DeleteGroupsResult:
            by_name = dict(result.errors) if result else {}
            return m.DeleteGroupsResult(tuple(
                (g, by_name[g] if g in by_name else denied(ResourceType.GROUP, g, Op.DELETE)) for g in cmd.groups))

        if not allowed:
            return merge(None)
        return then(self.broker.run(m.DeleteGroups(allowed)), merge)

    def _delete_offsets(self, cmd: m.DeleteOffsets, caller: m.Caller) -> Any:
        if not self.may(caller, Op.DELETE, ResourceType.GROUP, cmd.group):
            return m.DeleteOffsetsResult(cmd.group, error=denied(ResourceType.GROUP, cmd.group, Op.DELETE))
        readable = {t for t, _ in cmd.partitions if self.may(caller, Op.READ, ResourceType.TOPIC, t)}
        refused = tuple((t, p, denied(ResourceType.TOPIC, t, Op.READ)) for t, p in cmd.partitions if t not in readable)
        if not refused:
            return self.broker.run(cmd)
        allowed = tuple((t, p) for t, p in cmd.partitions if t in readable)
        if not allowed:
            return m.DeleteOffsetsResult(cmd.group, refused)
        return then(self.broker.run(attrs.evolve(cmd, partitions=allowed)),
                    lambda result: attrs.evolve(result, errors=result.errors + refused))

    # ------------------------------------------------------------------ producers

    def _init_producer_id(self, cmd: m.InitProducerId, caller: m.Caller) -> Any:
        if cmd.transactional_id is not None:
            if self.may(caller, Op.WRITE, ResourceType.TRANSACTIONAL_ID, cmd.transactional_id):
                return self.broker.run(cmd)
            return m.InitProducerIdResult(error=denied(ResourceType.TRANSACTIONAL_ID, cmd.transactional_id, Op.WRITE))
        if (self.may(caller, Op.IDEMPOTENT_WRITE, ResourceType.CLUSTER, m.CLUSTER_RESOURCE)
                or self.acls.allowed_on_some(caller.principal, caller.host, Op.WRITE, ResourceType.TOPIC)):
            return self.broker.run(cmd)
        return m.InitProducerIdResult(error=denied(ResourceType.CLUSTER, m.CLUSTER_RESOURCE, Op.IDEMPOTENT_WRITE))

    def _describe_configs(self, cmd: m.DescribeConfigs, caller: m.Caller) -> Any:
        def refuse(t: m.TopicSettings) -> m.TopicSettings:
            if self.may(caller, Op.DESCRIBE_CONFIGS, ResourceType.TOPIC, t.topic):
                return t
            return m.TopicSettings(t.topic, error=denied(ResourceType.TOPIC, t.topic, Op.DESCRIBE_CONFIGS))
        return then(self.broker.run(cmd), lambda r: m.DescribeConfigsResult(tuple(map(refuse, r.topics))))

    # ------------------------------------------------------------------ transactions

    def _add_partitions_to_txn(self, cmd: m.AddPartitionsToTxn, caller: m.Caller) -> Any:
        if not self.may(caller, Op.WRITE, ResourceType.TRANSACTIONAL_ID, cmd.transactional_id):
            return m.AddPartitionsToTxnResult(error=denied(ResourceType.TRANSACTIONAL_ID, cmd.transactional_id,
                                                           Op.WRITE))
        refused = next((t for t, _ in cmd.partitions if not self.may(caller, Op.WRITE, ResourceType.TOPIC, t)), None)
        if refused is not None:
            return m.AddPartitionsToTxnResult(error=denied(ResourceType.TOPIC, refused, Op.WRITE))
        return self.broker.run(cmd)

    def _txn_and_group(self, refuse: Callable[[Any, m.Error], Any]) -> Callable[[Any, m.Caller], Any]:
        """Write on the command's transactional id, then Read on its group."""
        def rule(cmd: Any, caller: m.Caller) -> Any:
            if not self.may(caller, Op.WRITE, ResourceType.TRANSACTIONAL_ID, cmd.transactional_id):
                return refuse(cmd, denied(ResourceType.TRANSACTIONAL_ID, cmd.transactional_id, Op.WRITE))
            if not self.may(caller, Op.READ, ResourceType.GROUP, cmd.group):
                return refuse(cmd, denied(ResourceType.GROUP, cmd.group, Op.READ))
            return self.broker.run(cmd)
        return rule

    def _list_transactions(self, cmd: m.ListTransactions, caller: m.Caller) -> Any:
        return then(self.broker.run(cmd), lambda r: m.ListTransactionsResult(tuple(
            t for t in r.transactions
            if self.may(caller, Op.DESCRIBE, ResourceType.TRANSACTIONAL_ID, t.transactional_id))))

    def _describe_transactions(self, cmd: m.DescribeTransactions, caller: m.Caller) -> Any:
        def refuse(t: m.TransactionInfo) -> m.TransactionInfo:
            if self.may(caller, Op.DESCRIBE, ResourceType.TRANSACTIONAL_ID, t.transactional_id):
                return t
            return m.TransactionInfo(t.transactional_id, -1, -1, "", 0, -1, error=denied(
                ResourceType.TRANSACTIONAL_ID, t.transactional_id, Op.DESCRIBE))
        return then(self.broker.run(cmd), lambda r: m.DescribeTransactionsResult(tuple(map(refuse, r.transactions))))

    def _describe_producers(self, cmd: m.DescribeProducers, caller: m.Caller) -> Any:
        def refuse(item: tuple) -> tuple:
            topic, partition, producers, error = item
            if self.may(caller, Op.READ, ResourceType.TOPIC, topic):
                return item
            return topic, partition, (), denied(ResourceType.TOPIC, topic, Op.READ)
        return then(self.broker.run(cmd), lambda r: m.DescribeProducersResult(tuple(map(refuse, r.partitions))))
