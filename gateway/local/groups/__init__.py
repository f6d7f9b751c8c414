"""The local group coordinator: every group rule of the local store, classic and KIP-848.

``coordinator.GroupCoordinator`` is its one face; one module per concern behind it:
``state`` (a classic group's state and its record), ``classic`` (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup of V1, Cursus and Kafka's classic groups), ``rebalance`` (Kafka's
rebalance barrier, with Deferreds), ``consumer`` (Kafka's consumer protocol, KIP-848) and
``offsets`` (committed offsets). The engine (``gateway.storage``) only saves and replays
the group records the coordinator gives it.
"""

from gateway.local.groups.coordinator import GroupCoordinator

__all__ = ["GroupCoordinator"]
