"""The cluster store's groups (``gateway.cluster.groups``) without a cluster: a DeleteGroups waits
until the cluster was told that the group's expired members left, the housekeeping sweep's too."""

from __future__ import annotations

import time
from concurrent.futures import Future

from twisted.internet import defer

from gateway import model as m
from gateway.cluster.config import ClusterConfig
from gateway.cluster.groups import ClusterGroups, ClusterMember, Member
from gateway.testing import Reactor


class Admin:
    """The librdkafka admin calls the groups make: DeleteGroups, answered at once."""

    def __init__(self):
        self.deleted: list[list[str]] = []

    def delete_consumer_groups(self, groups: list[str], request_timeout: float) -> dict[str, Future]:
        self.deleted.append(groups)
        answers = {g: Future() for g in groups}
        for f in answers.values():
            f.set_result(None)
        return answers


class Coordinators:
    """The gateway's own requests to the groups' coordinators: a static member's LeaveGroup."""

    def __init__(self):
        self.left: list[tuple[str, str, str]] = []

    def leave(self, group: str, member_id: str, instance_id: str) -> defer.Deferred:
        self.left.append((group, member_id, instance_id))
        return defer.succeed(None)


def test_a_group_is_deleted_once_the_sweeps_expired_static_member_left_the_cluster():
    """The sweep expired a closed static member just before DeleteGroups came; its consumer is still
    closing in the groups thread (not run here until the test runs it): the cluster is asked to
    delete the group only once the member left it, else the cluster answers NON_EMPTY_GROUP."""
    admin, coordinators = Admin(), Coordinators()
    groups = ClusterGroups(ClusterConfig("127.0.0.1:1"), admin, coordinators, Reactor())
    cluster = ClusterMember("g", ("t",), "range", "polygate-kafka:app-1", instance_id="instance-1",
                            member_id="cluster-member-1", assigned=True)
    groups.clusters.add(cluster)
    member = groups.members[("g", "app-1")] = Member("g", "app-1", ("t",), 10, cluster, kind="consumer")
    member.last_seen = time.monotonic() - 1  # its 10 ms session ended

    groups.expire()  # the housekeeping sweep
    assert not groups.members
    deleted = groups.delete(m.DeleteGroups(("g",)))
    assert admin.deleted == [] and not deleted.called, "the member is still in the cluster's group"

    groups._work.get_nowait()()  # the groups thread closes the member's consumer
    assert coordinators.left == [("g", "cluster-member-1", "instance-1")]
    assert admin.deleted == [["g"]]
    assert deleted.result == m.DeleteGroupsResult((("g", None),))
    assert not groups.leaving
