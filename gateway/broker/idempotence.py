"""Idempotent producer rules, per protocol, over one partition's producer state.

State is a msgpack-friendly dict kept by the engine per (partition,
producer id): ``{"e": epoch, "s": last sequence, "b": [[first_seq,
last_seq, base_offset, last_offset], ...]}`` (the most recent batches).

``check`` returns ``None`` to append, a ``(base_offset, last_offset)`` pair
for a duplicate to acknowledge without appending, or raises
``CommandError``. ``after_append`` gives the state to store.

A batch that fails with an error its client sends it again after (``RETRIED``:
a timeout, a storage error, a lost leader) leaves a gap in the producer's
sequence that the client fills. The batches of that producer and partition the
client had already sent behind it, checked meanwhile, fail with the same error
rather than as out of order: the client then sends them again, in order, after
the failed one. An out-of-order answer instead makes Kafka's clients bump their
epoch themselves and number their batches from 0 again (as librdkafka and the
Java client do), and a cluster behind the gateway may refuse an epoch it did
not hand out (Tansu fences it for good). ``Sequences`` applies ``check`` with
that rule: it remembers the failed batch beside the stored state, because a
store may know no state yet (a first batch) or drop its own on such a failure
(a cluster's, which reads it back then, as the failed batch may be stored).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from gateway.model import CommandError, Error, ErrorCode, ProducerState

REMEMBERED_BATCHES = 5
# Errors after which clients send the same batch again (see the module docstring).
RETRIED = frozenset({ErrorCode.REPLICATION_TIMEOUT, ErrorCode.STORAGE_ERROR, ErrorCode.NOT_LEADER})
FAILURES_REMEMBERED = 10_000  # producers and partitions whose last batch failed, at most (the oldest go)

Key = tuple[str, int, Any]  # (topic, partition, producer id)


def check(state: dict[str, Any] | None, p: ProducerState) -> tuple[int, int] | None:
    if p.rules == "kafka":
        return _check_kafka(state, p)
    if p.rules == "cursus":
        return _check_cursus(state, p)
    raise CommandError(ErrorCode.UNSUPPORTED, f"unknown idempotence rules {p.rules!r}")


def _duplicate_of(state: dict[str, Any], p: ProducerState) -> tuple[int, int] | None:
    for first, last, base, last_offset in state["b"]:
        if first == p.first_sequence and last == p.last_sequence:
            return base, last_offset
    return None


def _check_kafka(state: dict[str, Any] | None, p: ProducerState) -> tuple[int, int] | None:
    """Kafka: sequences per partition from 0, duplicates among the last 5 batches."""
    if state is None:
        return None
    if p.epoch < state["e"]:
        raise CommandError(ErrorCode.FENCED_PRODUCER,
                           f"producer {p.producer_id} epoch {p.epoch} is older than {state['e']}")
    if p.epoch > state["e"]:
        if p.first_sequence != 0:
            raise CommandError(ErrorCode.INVALID_SEQUENCE,
                               f"new epoch {p.epoch} must start at sequence 0, not {p.first_sequence}")
        return None
    duplicate = _duplicate_of(state, p)
    if duplicate is not None:
        return duplicate
    expected = (state["s"] + 1) & 0x7FFFFFFF
    if p.first_sequence != expected:
        raise CommandError(ErrorCode.INVALID_SEQUENCE,
                           f"out of order sequence: expected {expected}, got {p.first_sequence}")
    return None


def _check_cursus(state: dict[str, Any] | None, p: ProducerState) -> tuple[int, int] | None:
    """Cursus (``Partition.validateAgainstProducerState``): sequences from 1.

    A batch whose every sequence is at or below the last one is a duplicate.
    """
    if state is None or p.epoch > state["e"]:
        if p.first_sequence != 1:
            raise CommandError(
                ErrorCode.INVALID_SEQUENCE,
                f"idempotency error: first message for producer {p.producer_id} must have seqNum 1, "
                f"got {p.first_sequence}")
        return None
    if p.epoch < state["e"]:
        raise CommandError(ErrorCode.FENCED_PRODUCER,
                           f"stale_producer_epoch producer={p.producer_id} current={state['e']} got={p.epoch}")
    if p.last_sequence <= state["s"]:
        return _duplicate_of(state, p) or (state["b"][-1][2], state["b"][-1][3])
    if p.first_sequence != state["s"] + 1:
        raise CommandError(
            ErrorCode.INVALID_SEQUENCE,
            f"idempotency gap for producer {p.producer_id}: expected {state['s'] + 1}, got {p.first_sequence}")
    return None


def after_append(state: dict[str, Any] | None, p: ProducerState, base: int, last: int) -> dict[str, Any]:
    batches = [] if state is None or state["e"] != p.epoch else list(state["b"])
    batches.append([p.first_sequence, p.last_sequence, base, last])
    return {"e": p.epoch, "s": p.last_sequence, "b": batches[-REMEMBERED_BATCHES:]}


class Sequences:
    """``check`` for the batches of many producers and partitions (``Key``), remembering for each
    its last batch that failed with an error its client sends it again after (``RETRIED``): a batch
    of the same epoch beyond it that the rules refuse as a gap gets that error instead (see the
    module docstring). At most ``FAILURES_REMEMBERED`` failures are kept, the least recent go."""

    def __init__(self) -> None:
        # key -> (epoch, first sequence, error) of the producer's last batch there, failed (``RETRIED``)
        self._failed: OrderedDict[Key, tuple[int, int, Error]] = OrderedDict()

    def check(self, key: Key, state: dict[str, Any] | None, p: ProducerState) -> tuple[int, int] | None:
        """``check(state, p)``, but a gap behind a batch that failed retriably is answered with its error."""
        try:
            return check(state, p)
        except CommandError as e:
            failed = self._failed.get(key)
            if e.error.code is not ErrorCode.INVALID_SEQUENCE or failed is None:
                raise
            epoch, first_sequence, error = failed
            if p.epoch != epoch or p.first_sequence <= first_sequence:
                raise
            raise CommandError(error.code, f"{error.message} (for the batch from sequence {first_sequence}, "
                                           f"which this one follows)") from None

    def stored(self, key: Key) -> None:
        """The producer's batch at ``key`` was stored (or acknowledged as a duplicate): no gap left."""
        self._failed.pop(key, None)

    def failed(self, key: Key, p: ProducerState, error: Error) -> None:
        """The producer's batch at ``key`` failed with ``error``: remembered if its client sends it again."""
        if error.code not in RETRIED:
            self._failed.pop(key, None)
            return
        self._failed[key] = (p.epoch, p.first_sequence, error)
        self._failed.move_to_end(key)
        if len(self._failed) > FAILURES_REMEMBERED:
            self._failed.popitem(last=False)
