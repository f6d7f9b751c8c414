"""Between librdkafka's threads and the reactor.

confluent-kafka answers admin calls with ``concurrent.futures.Future``s and
delivery reports on the thread that polls; the broker wants Deferreds that
fire in the reactor thread. Everything here hands results over with
``reactor.callFromThread``, so state owned by the reactor thread is only
ever touched there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message
from twisted.internet import defer

from gateway.model import CommandError, ErrorCode

log = logging.getLogger(__name__)

# librdkafka errors that mean "the cluster did not confirm in time": the protocols' replication timeout.
TIMEOUTS = {KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT,
            KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND}
AS_MODEL = {
    KafkaError.TOPIC_ALREADY_EXISTS: ErrorCode.TOPIC_EXISTS,
    KafkaError.UNKNOWN_TOPIC_OR_PART: ErrorCode.UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_TOPIC: ErrorCode.UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION: ErrorCode.UNKNOWN_PARTITION,
    KafkaError.TOPIC_EXCEPTION: ErrorCode.INVALID_TOPIC,
    KafkaError.INVALID_PARTITIONS: ErrorCode.INVALID_REQUEST,
    KafkaError.INVALID_REPLICATION_FACTOR: ErrorCode.INVALID_REQUEST,
    KafkaError.INVALID_CONFIG: ErrorCode.INVALID_REQUEST,
    KafkaError.INVALID_REQUEST: ErrorCode.INVALID_REQUEST,
    KafkaError.MSG_SIZE_TOO_LARGE: ErrorCode.INVALID_REQUEST,
    KafkaError.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_REQUEST,
    KafkaError.INVALID_MSG: ErrorCode.CORRUPT_MESSAGE,
    KafkaError.ILLEGAL_GENERATION: ErrorCode.GENERATION_MISMATCH,
    KafkaError.UNKNOWN_MEMBER_ID: ErrorCode.UNKNOWN_MEMBER,
    KafkaError.REBALANCE_IN_PROGRESS: ErrorCode.REBALANCE_IN_PROGRESS,
    KafkaError.GROUP_ID_NOT_FOUND: ErrorCode.GROUP_NOT_FOUND,
    KafkaError.NON_EMPTY_GROUP: ErrorCode.INVALID_REQUEST,
    KafkaError.OFFSET_OUT_OF_RANGE: ErrorCode.OFFSET_OUT_OF_RANGE,
}


def consumed_at(msg: Message) -> tuple[str, int, int]:
    """Where a consumed message (or end-of-partition event) is: topic, partition, offset, which it
    always has (confluent-kafka types them optional, as for a message being produced)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def consumed_headers(msg: Message) -> list[tuple[str, bytes | None]]:
    """A consumed message's headers, in order (confluent-kafka types them as a producer may
    give them: a dict, or values as str)."""
    return cast(list[tuple[str, bytes | None]], msg.headers() or [])


def command_error(error: Any, doing: str) -> CommandError:
    """The ``CommandError`` a client hears for librdkafka's ``error`` (a ``KafkaError``,
    a ``KafkaException`` or any exception) met while ``doing`` something."""
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        error = error.args[0]
    if isinstance(error, KafkaError):
        code = error.code()
        if code in TIMEOUTS:
            return CommandError(ErrorCode.REPLICATION_TIMEOUT, f"{doing}: the Kafka cluster did not confirm in time "
                                                               f"({error.str()})")
        model = AS_MODEL.get(code)
        if model is not None:
            return CommandError(model, f"{doing}: {error.str()}")
        return CommandError(ErrorCode.STORAGE_ERROR, f"{doing}: Kafka cluster error {error.name()}: {error.str()}")
    return CommandError(ErrorCode.STORAGE_ERROR, f"{doing}: {error}")


def deferred_from(reactor: Any, future: Future, doing: str,
                  convert: Callable[[Any], Any] = lambda v: v) -> defer.Deferred:
    """A Deferred that fires in the reactor thread with ``convert(future.result())``,
    or fails with the ``CommandError`` for the future's exception."""
    d: defer.Deferred = defer.Deferred()

    def done(f: Future) -> None:
        try:
            value = convert(f.result())
        except CommandError as e:
            reactor.callFromThread(d.errback, e)
        except Exception as e:  # noqa: BLE001 - librdkafka's error becomes the client's
            reactor.callFromThread(d.errback, command_error(e, doing))
        else:
            reactor.callFromThread(d.callback, value)

    future.add_done_callback(done)
    return d


class Loop:
    """A daemon thread that calls ``step()`` until stopped; ``step`` errors are logged, not fatal."""

    def __init__(self, name: str, step: Callable[[], object]):
        self.step = step
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 - the loop outlives one bad turn
                log.exception("%s: unexpected error (the loop goes on)", self.thread.name)
                self.stopping.wait(1)

    def stop(self, timeout: float = 10) -> None:
        self.stopping.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)
