"""Replication bookkeeping of one partition, as the V1 broker defines it.

The leader is replica 0 and followers are 1..RF-1. A follower is in sync when
it reported progress within ``lag_timeout_ms`` and is at most ``max_lag``
records behind. The high watermark (exclusive, Kafka's convention) is the
minimum of the leader's log end and the in-sync followers' progress; with no
follower in sync it is the leader's log end, so acks=1 data is visible at
once. It never moves backwards while the partition leads.
"""

from __future__ import annotations

import attrs


@attrs.define
class FollowerState:
    acked_offset: int = -1  # last offset the follower holds
    last_ack_ms: int = -1


@attrs.define
class ReplicaSet:
    replication_factor: int
    min_insync: int
    lag_timeout_ms: int
    max_lag: int = 0
    role: str = "leader"
    high_watermark: int = 0
    followers: dict[int, FollowerState] = attrs.Factory(dict)

    def __attrs_post_init__(self) -> None:
        for rid in range(1, self.replication_factor):
            self.followers.setdefault(rid, FollowerState())

    def in_sync_followers(self, log_end: int, now_ms: int) -> list[int]:
        return [
            rid for rid, f in sorted(self.followers.items())
            if f.last_ack_ms >= 0 and now_ms - f.last_ack_ms <= self.lag_timeout_ms
            and (log_end - 1) - f.acked_offset <= self.max_lag
        ]

    def isr(self, log_end: int, now_ms: int) -> tuple[int, ...]:
        return (0, *self.in_sync_followers(log_end, now_ms))

    def update(self, log_end: int, now_ms: int) -> int:
        """Recompute and return the high watermark."""
        if self.role != "leader":
            return self.high_watermark
        hw = log_end
        for rid in self.in_sync_followers(log_end, now_ms):
            hw = min(hw, self.followers[rid].acked_offset + 1)
        self.high_watermark = max(self.high_watermark, hw)
        return self.high_watermark

    def enough_replicas(self, log_end: int, now_ms: int) -> bool:
        return len(self.isr(log_end, now_ms)) >= min(self.min_insync, self.replication_factor)

    def report(self, replica_id: int, offset: int, now_ms: int) -> None:
        state = self.followers.setdefault(replica_id, FollowerState())
        state.acked_offset = offset
        state.last_ack_ms = now_ms

    def set_role(self, role: str, log_end: int, now_ms: int) -> None:
        self.role = role
        if role == "follower":
            self.high_watermark = 0
        else:
            self.high_watermark = 0
            self.update(log_end, now_ms)
