"""Partitioners of the protocols, so a keyed record lands where its client expects.

V1 brokers use FNV-1a 32 of the key, the Cursus broker FNV-1a 64, Kafka
clients murmur2 (positive part) of the key; unkeyed records go round-robin.
The hashes run in C where ``gateway._speedups`` is built (the same values).
"""

from __future__ import annotations

from gateway._extensions import load

_speedups = load("gateway._speedups")  # None: the Python hashes below


def _fnv1a_32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def _fnv1a_64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), as an unsigned 32-bit int."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    extra = length % 4
    tail = length & ~3
    if extra >= 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


fnv1a_32 = _fnv1a_32 if _speedups is None else _speedups.fnv1a_32
fnv1a_64 = _fnv1a_64 if _speedups is None else _speedups.fnv1a_64
murmur2 = _murmur2 if _speedups is None else _speedups.murmur2


def choose(partitioner: str, key: bytes | None, partitions: int, counter: int) -> int:
    """The partition for ``key`` among ``partitions``; ``counter`` drives round-robin."""
    if key is None or partitioner == "round_robin":
        return counter % partitions
    if partitioner == "fnv1a_32":
        return fnv1a_32(key) % partitions
    if partitioner == "fnv1a_64":
        return fnv1a_64(key) % partitions
    if partitioner == "murmur2":
        return (murmur2(key) & 0x7FFFFFFF) % partitions
    raise ValueError(f"unknown partitioner {partitioner!r}")
