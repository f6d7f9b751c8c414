"""Idempotent producer rules, per protocol, over one partition's producer state.

State is a msgpack-friendly dict kept by the engine per (partition,
producer id): ``{"e": epoch, "s": last sequence, "b": [[first_seq,
last_seq, base_offset, last_offset], ...]}`` (the most recent batches).

``check`` returns ``None`` to append, a ``(base_offset, last_offset)`` pair
for a duplicate to acknowledge without appending, or raises
``CommandError``. ``after_append`` gives the state to store.
"""

from __future__ import annotations

from typing import Any

from gateway.model import CommandError, ErrorCode, ProducerState

REMEMBERED_BATCHES = 5


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
