"""The cluster client's fixed Produce encoder and decoder against the codec's schema, for every
version the client uses: the same bytes out, the same fields read back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.cluster import shapes
from gateway.cluster.wire import NEEDED, PRODUCE, WANTED
from gateway.codecs.kafka import schema
from gateway.codecs.kafka.errors import Errors

VERSIONS = range(NEEDED[PRODUCE], WANTED[PRODUCE] + 1)
topics = st.text(st.characters(codec="ascii", exclude_characters="\0"), min_size=1, max_size=300)


def by_schema(version: int, correlation: int, client_id: str, acks: int, timeout_ms: int, topic: str,
              partition: int, batch: bytes, transactional_id: str | None = None) -> bytes:
    message = schema.MESSAGES[PRODUCE]
    header = {"RequestApiKey": PRODUCE, "RequestApiVersion": version, "CorrelationId": correlation,
              "ClientId": client_id}
    body = {"TransactionalId": transactional_id, "Acks": acks, "TimeoutMs": timeout_ms, "TopicData": [
        {"Name": topic, "PartitionData": [{"Index": partition, "Records": batch}]}]}
    return schema.build_frame(((schema.request_header(message.flexible(version)), header),
                               (message.request(version), body)))


def answer(version: int, topics: list[tuple[str, list[tuple[int, int, int, str | None]]]]) -> bytes:
    """A Produce response frame (without its size) built by the schema."""
    message = schema.MESSAGES[PRODUCE]
    body = {"ThrottleTimeMs": 0, "Responses": [{"Name": name, "PartitionResponses": [
        {"Index": index, "ErrorCode": error, "BaseOffset": base, "LogAppendTimeMs": -1, "LogStartOffset": 0,
         "RecordErrors": [], "ErrorMessage": text} for index, error, base, text in partitions]}
        for name, partitions in topics]}
    return (schema.build(schema.response_header(PRODUCE, message.flexible(version)), {"CorrelationId": 7})
            + schema.build(message.response(version), body))


@given(version=st.sampled_from(VERSIONS), correlation=st.integers(0, 2**31 - 1), client_id=st.text(st.characters(codec="ascii"), max_size=40),
       acks=st.sampled_from([-1, 0, 1]), timeout_ms=st.integers(1, 2**31 - 1), topic=topics,
       partition=st.integers(0, 2**31 - 1), batch=st.binary(max_size=300),
       transactional_id=st.none() | topics)
def test_the_fixed_produce_request_is_the_schemas(version, correlation, client_id, acks, timeout_ms, topic,
                                                  partition, batch, transactional_id):
    pieces = shapes.produce_request(version, correlation, client_id.encode(), acks, timeout_ms, topic.encode(),
                                    partition, batch, None if transactional_id is None else transactional_id.encode())
    assert b"".join(pieces) == by_schema(version, correlation, client_id, acks, timeout_ms, topic, partition, batch,
                                         transactional_id)


@given(version=st.sampled_from(VERSIONS), topic=topics, partition=st.integers(0, 2**31 - 1), base=st.integers(0, 2**63 - 1),
       error=st.sampled_from([0, Errors.NOT_LEADER_OR_FOLLOWER, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER]))
def test_the_fixed_produce_answer_reads_what_the_schema_reads(version, topic, partition, base, error):
    message = "refused" if error and version >= 8 else None  # ErrorMessage is in versions 8 and later
    got = shapes.produced(answer(version, [(topic, [(partition, error, base, message)])]), version)
    assert got == shapes.Produced(error, base, message)


@pytest.mark.parametrize("version", VERSIONS)
def test_an_answer_of_another_shape_is_read_by_the_schema(version):
    two_partitions = answer(version, [("t", [(3, 0, 40, None), (4, 0, 50, None)])])
    assert shapes.produced(two_partitions, version) == shapes.Produced(0, 40)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_stored_batch_is_read_without_the_schema(version, monkeypatch):
    def by_schema(*_):
        raise AssertionError("read by the schema")

    monkeypatch.setattr(shapes, "_produced_by_schema", by_schema)
    assert shapes.produced(answer(version, [("topic", [(0, 0, 1234, None)])]), version) == shapes.Produced(0, 1234)
