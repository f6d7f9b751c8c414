"""What a client hears for an error the Kafka cluster answered: one map for every request the
cluster store makes, through its own wire client (``gateway.cluster.wire``: produce, fetch,
commits, the groups' and transactions' coordinators) or through librdkafka
(``gateway.cluster.bridge``: admin calls, security records).

librdkafka gives a Kafka error under the code the cluster answered, and its own failures under
negative codes of its own (``KafkaError._*``): both are keys here. A code the map does not name is
the protocols' storage error.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

from gateway.codecs.kafka.errors import Errors
from gateway.model import ErrorCode

AS_MODEL: dict[int, ErrorCode] = {
    # requests the cluster refused
    Errors.INVALID_REQUEST: ErrorCode.INVALID_REQUEST,
    Errors.MESSAGE_TOO_LARGE: ErrorCode.INVALID_REQUEST, Errors.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_REQUEST,
    Errors.CORRUPT_MESSAGE: ErrorCode.CORRUPT_MESSAGE, Errors.INVALID_RECORD: ErrorCode.CORRUPT_MESSAGE,
    # topics and partitions
    Errors.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.UNKNOWN_TOPIC, KafkaError._UNKNOWN_TOPIC: ErrorCode.UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION: ErrorCode.UNKNOWN_PARTITION,
    Errors.INVALID_TOPIC_EXCEPTION: ErrorCode.INVALID_TOPIC, Errors.TOPIC_ALREADY_EXISTS: ErrorCode.TOPIC_EXISTS,
    Errors.INVALID_PARTITIONS: ErrorCode.INVALID_REQUEST, Errors.INVALID_REPLICATION_FACTOR: ErrorCode.INVALID_REQUEST,
    Errors.INVALID_CONFIG: ErrorCode.INVALID_REQUEST,
    # idempotent producers
    Errors.INVALID_PRODUCER_EPOCH: ErrorCode.FENCED_PRODUCER, Errors.PRODUCER_FENCED: ErrorCode.FENCED_PRODUCER,
    Errors.OUT_OF_ORDER_SEQUENCE_NUMBER: ErrorCode.INVALID_SEQUENCE, Errors.UNKNOWN_PRODUCER_ID: ErrorCode.INVALID_SEQUENCE,
    # the cluster did not confirm in time
    Errors.REQUEST_TIMED_OUT: ErrorCode.REPLICATION_TIMEOUT, Errors.NOT_ENOUGH_REPLICAS: ErrorCode.REPLICATION_TIMEOUT,
    Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.REPLICATION_TIMEOUT,
    Errors.NETWORK_EXCEPTION: ErrorCode.REPLICATION_TIMEOUT,
    KafkaError._MSG_TIMED_OUT: ErrorCode.REPLICATION_TIMEOUT, KafkaError._TIMED_OUT: ErrorCode.REPLICATION_TIMEOUT,
    # groups and commits
    Errors.ILLEGAL_GENERATION: ErrorCode.GENERATION_MISMATCH, Errors.UNKNOWN_MEMBER_ID: ErrorCode.UNKNOWN_MEMBER,
    Errors.REBALANCE_IN_PROGRESS: ErrorCode.REBALANCE_IN_PROGRESS, Errors.GROUP_ID_NOT_FOUND: ErrorCode.GROUP_NOT_FOUND,
    Errors.FENCED_INSTANCE_ID: ErrorCode.FENCED_INSTANCE_ID, Errors.NON_EMPTY_GROUP: ErrorCode.INVALID_REQUEST,
    Errors.OFFSET_METADATA_TOO_LARGE: ErrorCode.INVALID_REQUEST,
    Errors.INVALID_COMMIT_OFFSET_SIZE: ErrorCode.INVALID_REQUEST,
    Errors.GROUP_SUBSCRIBED_TO_TOPIC: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
    # records
    Errors.OFFSET_OUT_OF_RANGE: ErrorCode.OFFSET_OUT_OF_RANGE,  # DeleteRecords past the high watermark
    # a cluster without the call (Tansu 0.6: OffsetDelete)
    Errors.UNSUPPORTED_VERSION: ErrorCode.UNSUPPORTED,
    # authorization
    Errors.GROUP_AUTHORIZATION_FAILED: ErrorCode.GROUP_AUTHORIZATION,
    Errors.TOPIC_AUTHORIZATION_FAILED: ErrorCode.TOPIC_AUTHORIZATION,
}
# The cluster's answers about a producer's sequence: the client's own only when its batch went to the
# cluster as the client stamped it.
SEQUENCE = frozenset({Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, Errors.UNKNOWN_PRODUCER_ID})


def as_model(code: int, clients_sequence: bool = True) -> ErrorCode:
    """The model's error for the cluster's (or librdkafka's) error ``code``: ``STORAGE_ERROR`` when
    the map does not name it, and for a sequence error (``SEQUENCE``) unless ``clients_sequence``:
    one of a producer of the gateway's own (a transaction's batch re-stamped with the cluster's
    producer, ``gateway.cluster.transactions``) is not the client's to fix, and an out-of-order
    answer makes Kafka clients bump their epoch."""
    if not clients_sequence and code in SEQUENCE:
        return ErrorCode.STORAGE_ERROR
    return AS_MODEL.get(code, ErrorCode.STORAGE_ERROR)
