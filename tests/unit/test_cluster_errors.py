"""The cluster's error codes as clients hear them, through the wire client and through librdkafka alike."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from gateway.cluster import bridge, writer
from gateway.cluster.wire import WireError
from gateway.codecs.kafka.errors import Errors
from gateway.model import ErrorCode


@pytest.mark.parametrize(("code", "model"), [
    (Errors.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC),
    (Errors.REQUEST_TIMED_OUT, ErrorCode.REPLICATION_TIMEOUT),
    (Errors.ILLEGAL_GENERATION, ErrorCode.GENERATION_MISMATCH),
    (Errors.TOPIC_ALREADY_EXISTS, ErrorCode.TOPIC_EXISTS),
    (Errors.BROKER_NOT_AVAILABLE, ErrorCode.STORAGE_ERROR),
])
def test_a_code_means_the_same_through_either_client(code, model):
    assert writer.command_error(WireError(code, "refused"), "x").error.code is model
    assert bridge.command_error(KafkaException(KafkaError(code)), "x").error.code is model


def test_librdkafkas_own_codes_are_mapped():
    assert bridge.command_error(KafkaError(KafkaError._MSG_TIMED_OUT), "x").error.code is ErrorCode.REPLICATION_TIMEOUT
    assert bridge.command_error(KafkaError(KafkaError._UNKNOWN_PARTITION), "x").error.code is ErrorCode.UNKNOWN_PARTITION


def test_a_sequence_error_is_the_clients_only_when_its_batch_went_as_stamped():
    """A batch the client stamped (the wire client's): the client renumbers. The gateway's own
    librdkafka producer's: not the client's to fix, a storage error (which it retries)."""
    code = Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert writer.command_error(WireError(code, "refused"), "x").error.code is ErrorCode.INVALID_SEQUENCE
    assert bridge.command_error(KafkaError(code), "x").error.code is ErrorCode.STORAGE_ERROR
