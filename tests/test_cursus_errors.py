"""Every Cursus reply and error string, byte for byte, over raw sockets (docs/protocols/cursus.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
from cursus.protocol.decoder import decode_batch
from cursus_support import RawCursus, batch, command, consume

from gateway.launcher import GatewayProcess
from gateway.partitioners import fnv1a_64


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    proc = GatewayProcess(str(tmp_path_factory.mktemp("cursus-errors")), ("cursus",),
                          ("--max-frame", "cursus=65536", "--codec-option", "cursus.stream_keepalive_ms=300"))
    proc.start()
    yield proc
    proc.assert_alive()
    proc.stop()


@pytest.fixture
def addr(gw):
    return gw.address("cursus")


@pytest.fixture
def topic(addr):
    name = f"e-{uuid.uuid4().hex[:8]}"
    assert command(addr, f"CREATE topic={name} partitions=2").startswith("OK ")
    return name


def _member(addr: str, topic: str, group: str) -> tuple[str, int]:
    reply = command(addr, f"JOIN_GROUP topic={topic} group={group} member=c")
    fields = dict(part.split("=", 1) for part in reply.split()[1:3])
    return fields["member"], int(fields["generation"])


# --------------------------------------------------------------------------- framing and classification


def test_raw_text_envelope_and_admin_envelope_are_all_accepted(addr):
    name = f"c-{uuid.uuid4().hex[:6]}"
    with RawCursus(addr) as c:
        assert c.command(f"CREATE topic={name} partitions=3", topic="admin") == (
            f"OK topic={name} partitions=3 cleanup_policy=delete partitioner=hash_key auth_policy=open read_acl= "
            f"write_acl= retention_hours=0 retention_bytes=0")
        assert c.raw_command(f"  METADATA topic={name}\n").startswith(f"OK topic={name} partitions=3 ")
        assert c.command(f"metadata topic={name}").startswith("OK topic=")  # names are case-insensitive
        assert name in c.command("LIST").split("topics=")[1].split(",")


def test_decode_failed_keeps_the_connection(addr):
    with RawCursus(addr) as c:
        assert c.raw_command("HELLO world") == 'ERROR: decode_failed reason="invalid topic length"'
        c.send_body(b"x")
        assert c.read_frame() == b'ERROR: decode_failed reason="data too short"'
        c.send_body(b"")
        assert c.read_frame() == b'ERROR: decode_failed reason="data too short"'
        assert c.command("LIST").startswith("OK count=")


def test_malformed_input_closes(addr):
    with RawCursus(addr) as c:
        assert c.command("HELLO world") == "ERROR: malformed_input reason=missing_topic_or_payload"
        assert c.closed()


def test_unknown_command_variants(addr):
    with RawCursus(addr) as c:
        assert c.command("LIST topic=x") == 'ERROR: unknown_command command="LIST topic=x"'
        assert c.command("GROUP_STATUS group=g") == 'ERROR: unknown_command command="GROUP_STATUS group=g"'
        assert c.command("HELP").startswith("OK commands=")


@pytest.mark.parametrize("length", [65537, 0xFFFFFFFF])
def test_oversize_frame_is_refused_and_closed(addr, length):
    with RawCursus(addr) as c:
        c.sock.sendall(length.to_bytes(4, "big") + b"\x00" * 100)
        assert c.read_frame().decode() == f"ERROR: frame_too_large size={length} max=65536"
        assert c.closed()


# --------------------------------------------------------------------------- topics


def test_create_errors(addr):
    assert command(addr, "CREATE partitions=2") == 'ERROR: missing_topic expected="CREATE topic=<name> [partitions=<N>]"'
    assert command(addr, "CREATE topic=bad/name").startswith('ERROR: invalid_topic_name topic="bad/name" reason=')
    assert command(addr, "CREATE topic=..").startswith('ERROR: invalid_topic_name topic=".." reason=')
    assert command(addr, "CREATE topic=x partitions=0") == 'ERROR: invalid_partitions reason="must be a positive integer"'
    assert command(addr, "CREATE topic=x partitions=two") == (
        'ERROR: invalid_partitions reason="must be a positive integer"')
    assert command(addr, "CREATE topic=x replication_factor=0") == (
        'ERROR: invalid_replication_factor reason="must be a positive integer"')


def test_create_again_adds_partitions_and_seed_positional_create(addr):
    name = f"p-{uuid.uuid4().hex[:6]}"
    assert command(addr, f"CREATE {name} 2").startswith(f"OK topic={name} partitions=2 ")
    assert command(addr, f"CREATE topic={name} partitions=5").startswith(f"OK topic={name} partitions=5 ")
    assert command(addr, f"CREATE topic={name}").startswith(f"OK topic={name} partitions=5 ")


def test_delete(addr, topic):
    assert command(addr, "DELETE") == 'ERROR: missing_topic expected="DELETE topic=<name>"'
    assert command(addr, f"DELETE topic={topic}") == f"OK topic={topic} deleted=true"
    assert command(addr, f"DELETE {topic}") == f"ERROR: topic_not_found topic={topic}"


def test_metadata_list_offsets_find_coordinator(gw, addr, topic):
    port = gw.port("cursus")
    assert command(addr, f"METADATA topic={topic}") == (
        f"OK topic={topic} partitions=2 leaders=127.0.0.1:{port},127.0.0.1:{port} epochs=0,0 cleanup_policy=delete "
        f"partitioner=hash_key auth_policy=open read_acl= write_acl= retention_hours=0 retention_bytes=0")
    assert command(addr, "METADATA") == "ERROR: missing_topic command=METADATA"
    assert command(addr, "METADATA topic=nope") == "ERROR: topic_not_found topic=nope"
    with RawCursus(addr) as c:
        c.send_body(batch(topic, 1, ["a", "b", "c"]))
        c.read_frame()
    assert command(addr, f"LIST_OFFSETS topic={topic}") == (
        f"OK topic={topic} partitions=2 offsets=P0:earliest=0:latest=0:leo=0:hwm=0,P1:earliest=0:latest=3:leo=3:hwm=3")
    assert command(addr, f"LIST_OFFSETS topic={topic} partition=1") == (
        f"OK topic={topic} partitions=1 offsets=P1:earliest=0:latest=3:leo=3:hwm=3")
    assert command(addr, f"LIST_OFFSETS topic={topic} partition=9") == "ERROR: partition_not_found partition=9"
    assert command(addr, f"LIST_OFFSETS topic={topic} partition=x") == "ERROR: invalid_partition command=LIST_OFFSETS"
    assert command(addr, "LIST_OFFSETS") == "ERROR: missing_topic command=LIST_OFFSETS"
    assert command(addr, "LIST_OFFSETS topic=nope") == "ERROR: topic_not_found topic=nope"
    assert command(addr, "FIND_COORDINATOR group=g") == (
        f"OK coordinator_id=standalone coordinator_type=group host=127.0.0.1 port={port}")
    assert command(addr, "FIND_COORDINATOR") == "ERROR: missing_coordinator_key command=FIND_COORDINATOR"


def test_subscribe_seed_command(addr, topic):
    assert command(addr, f"SUBSCRIBE {topic} g") == f"OK group=g topic={topic} subscribed=true"
    assert command(addr, "SUBSCRIBE nope g") == "ERROR: topic_not_found topic=nope"


# --------------------------------------------------------------------------- PUBLISH


def test_publish(addr, topic):
    assert command(addr, "PUBLISH acks=1 producerId=p message=x") == "ERROR: missing_topic command=PUBLISH"
    assert command(addr, f"PUBLISH topic={topic} producerId=p") == "ERROR: missing_message command=PUBLISH"
    assert command(addr, f"PUBLISH topic={topic} message=x") == "ERROR: missing_producer_id command=PUBLISH"
    assert command(addr, f"PUBLISH topic={topic} acks=2 producerId=p message=x") == "ERROR: invalid_acks value=2"
    assert command(addr, "PUBLISH topic=nope producerId=p message=x") == "ERROR: topic_not_found topic=nope"
    assert command(addr, f"PUBLISH topic={topic} acks=0 producerId=p partition=0 message=fire and forget") == "OK"
    ack = json.loads(command(addr, f"PUBLISH topic={topic} acks=all producerId=p partition=0 message=a=b c"))
    assert ack == {"status": "OK", "last_offset": 1, "producer_epoch": 0, "producer_id": "p", "seq_start": 0,
                   "seq_end": 0, "leader": addr, "error": ""}
    assert [m.payload for m in consume(addr, topic, 0)] == ["fire and forget", "a=b c"]
    # Without partition= the broker's FNV-1a 64 partitioner places keyed messages.
    for key in ("k1", "k2", "k3", "k4"):
        command(addr, f"PUBLISH topic={topic} producerId=p key={key} message=v-{key}")
    for key in ("k1", "k2", "k3", "k4"):
        part = fnv1a_64(key.encode()) % 2
        assert f"v-{key}" in [m.payload for m in consume(addr, topic, part)]


def test_publish_idempotent_gap_and_duplicate(addr, topic):
    base = f"PUBLISH topic={topic} partition=1 producerId=ip epoch=7 isIdempotent=true"
    assert command(addr, f"{base} seqNum=2 message=x") == (
        "ERROR: idempotency error: first message for producer ip must have seqNum 1, got 2")
    assert json.loads(command(addr, f"{base} seqNum=1 message=one"))["status"] == "OK"
    assert json.loads(command(addr, f"{base} seqNum=1 message=one"))["status"] == "OK"  # duplicate
    assert command(addr, f"{base} seqNum=3 message=three") == (
        "ERROR: idempotency gap for producer ip: expected 2, got 3")
    assert [m.payload for m in consume(addr, topic, 1)] == ["one"]


# --------------------------------------------------------------------------- batches (JSON acks)


def _ack(addr: str, body: bytes) -> dict:
    with RawCursus(addr) as c:
        c.send_body(body)
        return json.loads(c.read_frame())


def test_batch_acks_and_batch_errors(addr, topic):
    ok = _ack(addr, batch(topic, 0, ["a", "b"], producer_id="pb", epoch=9, first_seq=4))
    assert ok == {"status": "OK", "last_offset": 1, "producer_epoch": 9, "producer_id": "pb", "seq_start": 4,
                  "seq_end": 5, "leader": addr, "error": ""}
    assert _ack(addr, batch(topic, 0, ["a"])[:-3])["error"] == (
        'batch_decode_failed reason="failed to read message[0]: unexpected EOF"')
    assert _ack(addr, batch(topic, 0, ["a"], acks="2"))["error"] == "invalid_acks value=2"
    assert _ack(addr, batch("nope", 0, ["a"]))["error"] == "topic_not_found topic=nope"
    assert _ack(addr, batch(topic, 7, ["a"]))["error"] == "partition_not_found partition=7"
    empty = _ack(addr, batch(topic, 0, []))
    assert empty["status"] == "ERROR" and empty["error"] == 'broker_error reason="empty batch messages"'
    count = bytearray(batch(topic, 0, []))
    count[-4:] = (200_000).to_bytes(4, "big")
    assert _ack(addr, bytes(count))["error"] == (
        'batch_decode_failed reason="message count too high: 200000 (max: 100000)"')


def test_seed_layout_batch_is_accepted(addr, topic):
    real = batch(topic, 1, ["seed"])
    head = 4 + len(topic)
    seed = real[:head] + b"\x00\x011" + b"\x00\x011" + real[head + 6 :]  # partition "1", acks "1" as u16 strings
    assert _ack(addr, seed)["status"] == "OK"
    assert [m.payload for m in consume(addr, topic, 1)] == ["seed"]


# --------------------------------------------------------------------------- CONSUME


def test_consume_errors_and_forms(addr, topic):
    assert command(addr, f"CONSUME topic={topic} partition=0 offset=0") == "ERROR: invalid_consume_syntax"
    assert command(addr, f"CONSUME topic={topic} partition=0 offset=0 member=m isolation=dirty") == (
        "ERROR: invalid_isolation isolation=dirty")
    assert consume(addr, "nope", 0) == "ERROR: topic_not_found topic=nope"
    assert consume(addr, topic, 5) == "ERROR: partition_not_found partition=5"
    assert consume(addr, topic, 0) == []  # a batch of 0 records
    _ack(addr, batch(topic, 0, ["a", "b", "c"]))
    assert consume(addr, topic, 0, 9) == "ERROR: OFFSET_OUT_OF_RANGE requested=9 earliest=0 latest=3"
    assert [m.offset for m in consume(addr, topic, 0, 1)] == [1, 2]
    with RawCursus(addr) as c:  # the positional form
        c.send_body(f"CONSUME {topic} 0 2".encode())
        assert c.read_frame().endswith(b"c" + b"\x00" * 16)
    with RawCursus(addr) as c:
        c.send_body(b"\x00\x00" + f"CONSUME topic={topic} partition=0 offset=0 member=m batch=2".encode())
        assert [m.payload for m in decode_batch(c.read_frame())[0]] == ["a", "b"]


def test_consume_group_offset_overrides_and_wait_ms_long_polls(addr, topic):
    _ack(addr, batch(topic, 1, ["a", "b", "c"]))
    assert command(addr, f"COMMIT {topic} cg 1 2") == "OK"
    assert command(addr, f"COMMIT {topic}-none cg 1 2").startswith("ERROR: topic_not_found")  # as Kafka
    assert command(addr, f"COMMIT {topic} cg 7 2") == "ERROR: partition_not_found partition=7"
    assert [m.payload for m in consume(addr, topic, 1, 0, group="cg")] == ["c"]

    def later() -> None:
        time.sleep(0.3)
        _ack(addr, batch(topic, 1, ["late"]))

    threading.Thread(target=later).start()
    with RawCursus(addr) as c:
        c.send_body(b"\x00\x00" + f"CONSUME topic={topic} partition=1 offset=3 member=m wait_ms=5000".encode())
        assert [(m.offset, m.payload) for m in decode_batch(c.read_frame())[0]] == [(3, "late")]


def test_seed_positional_stream(addr, topic):
    _ack(addr, batch(topic, 1, ["a", "b"]))
    with RawCursus(addr) as c:
        c.send_body(f"STREAM {topic} 1 1".encode())
        assert [(m.offset, m.payload) for m in decode_batch(c.read_frame())[0]] == [(1, "b")]
        assert c.read_frame() == b""  # keepalive


def test_stream_errors(addr, topic):
    assert command(addr, f"STREAM topic={topic}") == "ERROR: missing_partition command=STREAM"
    assert command(addr, "STREAM partition=0") == "ERROR: missing_topic command=STREAM"
    assert command(addr, "STREAM topic=nope partition=0") == "ERROR: topic_not_found topic=nope"
    assert command(addr, f"STREAM topic={topic} partition=4") == "ERROR: partition_not_found partition=4"


# --------------------------------------------------------------------------- groups


def test_join_sync_heartbeat_leave(addr, topic):
    assert command(addr, "JOIN_GROUP group=g member=c") == "ERROR: missing_topic command=JOIN_GROUP"
    assert command(addr, f"JOIN_GROUP topic={topic} member=c") == "ERROR: missing_group command=JOIN_GROUP"
    assert command(addr, f"JOIN_GROUP topic={topic} group=g") == "ERROR: missing_member command=JOIN_GROUP"
    assert command(addr, "JOIN_GROUP topic=nope group=g member=c") == "ERROR: topic_not_found topic=nope"
    group = f"g-{uuid.uuid4().hex[:6]}"
    reply = command(addr, f"JOIN_GROUP topic={topic} group={group} member=c")
    member, gen = _member(addr, topic, group)  # a second member: the generation moves on
    first = reply.split()[2].split("=")[1]
    assert reply == f"OK generation={gen - 1} member={first} assignments=[0 1]"
    assert first[:-4] == "c-" and first[-4:].isdigit() and member != first
    assert command(addr, f"SYNC_GROUP topic={topic} group={group} member={member}") == (
        "ERROR: missing_generation command=SYNC_GROUP")
    assert command(addr, f"SYNC_GROUP topic={topic} group={group} member={member} generation=x") == (
        "ERROR: invalid_generation command=SYNC_GROUP")
    assert command(addr, f"SYNC_GROUP topic={topic} group={group} member={member} generation={gen}") == (
        f"OK generation={gen} member={member} assignments=[{0 if member < first else 1}]")
    assert command(addr, f"SYNC_GROUP {topic} {group} {member} {gen}").startswith(f"OK generation={gen} member=")
    assert command(addr, f"SYNC_GROUP topic={topic} group=nogroup member={member} generation={gen}") == (
        'ERROR: group_not_found reason="group nogroup not found"')
    assert command(addr, f"HEARTBEAT topic={topic} group={group} member={first} generation={gen - 1}") == (
        f"ERROR: GEN_MISMATCH current={gen} requested={gen - 1} group={group} member={first}")
    assert command(addr, f"HEARTBEAT {topic} {group} c {first} {gen - 1}") == (
        f"ERROR: REBALANCE_REQUIRED current={gen} requested={gen - 1} group={group} member={first}")
    assert command(addr, f"HEARTBEAT topic={topic} group={group} member={first}") == (
        "ERROR: missing_generation command=HEARTBEAT")
    assert command(addr, f"HEARTBEAT topic={topic} group={group} member=ghost generation={gen}") == (
        f"ERROR: member_not_found member=ghost group={group}")
    assert command(addr, f"HEARTBEAT topic={topic} group={group} member={first} generation={gen}") == (
        f"OK member={first} generation={gen}")
    assert command(addr, f"JOIN_GROUP topic={topic} group={group} member={first} generation={gen}") == (
        f"OK generation={gen} member={first} assignments=[{1 if member < first else 0}] resumed=true")
    assert command(addr, f"LEAVE_GROUP topic={topic} group={group} member={first}") == (
        f"OK group={group} member={first} left=true")
    assert command(addr, f"LEAVE_GROUP topic={topic} group={group} member={first}") == (
        f"ERROR: member_not_found member={first} group={group}")
    assert command(addr, f"LEAVE_GROUP {topic} {group} {member}") == f"OK group={group} member={member} left=true"
    positional = command(addr, f"JOIN_GROUP {topic} {group} seedling")
    assert positional.startswith("OK generation=") and "member=seedling-" in positional


def test_commit_offset_fetch_offset(addr, topic):
    group = f"g-{uuid.uuid4().hex[:6]}"
    member, gen = _member(addr, topic, group)
    base = f"topic={topic} group={group} member={member} generation={gen}"
    assert command(addr, f"FETCH_OFFSET topic={topic} partition=0 group={group}") == "OK offset=0"
    assert command(addr, f"FETCH_OFFSET topic={topic} partition=0 group=never") == "ERROR: group_not_found group=never"
    assert command(addr, f"FETCH_OFFSET topic={topic} group={group}") == "ERROR: missing_partition command=FETCH_OFFSET"
    for missing in ("topic", "partition", "group", "offset", "member", "generation"):
        args = {"topic": topic, "partition": "0", "group": group, "offset": "5", "member": member,
                "generation": str(gen)}
        del args[missing]
        text = " ".join(f"{k}={v}" for k, v in args.items())
        assert command(addr, f"COMMIT_OFFSET {text}") == f"ERROR: missing_{missing} command=COMMIT_OFFSET"
    assert command(addr, f"COMMIT_OFFSET {base} partition=0 offset=x") == "ERROR: invalid_offset"
    assert command(addr, f"COMMIT_OFFSET {base} partition=x offset=1") == "ERROR: invalid_partition"
    assert command(addr, f"COMMIT_OFFSET topic={topic} group={group} member={member} generation=x partition=0 "
                         f"offset=1") == "ERROR: invalid_generation command=COMMIT_OFFSET"
    assert command(addr, f"COMMIT_OFFSET {base} partition=0 offset=5 validate_only=true") == "OK validated=true"
    assert command(addr, f"FETCH_OFFSET topic={topic} partition=0 group={group}") == "OK offset=0"
    assert command(addr, f"COMMIT_OFFSET {base} partition=0 offset=5") == "OK"
    assert command(addr, f"COMMIT_OFFSET {base} partition=0 offset=5") == "OK"  # the same offset again
    assert command(addr, f"COMMIT_OFFSET {base} partition=0 offset=4") == (
        f'ERROR: offset_regression reason="offset regression group={group} topic={topic} partition=0 current=5 '
        f'got=4"')
    assert command(addr, f"COMMIT_OFFSET {base} partition=9 offset=1") == (
        f"ERROR: NOT_OWNER partition=9 member={member} group={group} generation={gen}")
    assert command(addr, f"COMMIT_OFFSET topic={topic} group={group} member={member} generation={gen - 1} "
                         f"partition=0 offset=6") == (
        f"ERROR: GEN_MISMATCH current={gen} requested={gen - 1} group={group} member={member}")
    assert command(addr, f"COMMIT_OFFSET topic={topic} group={group} member=ghost generation={gen} partition=0 "
                         f"offset=6") == f"ERROR: member_not_found member=ghost group={group}"
    assert command(addr, f"FETCH_OFFSET topic={topic} partition=0 group={group}") == "OK offset=5"
    assert command(addr, f"COMMIT {topic} {group} 0 3") == (
        f'ERROR: offset_regression reason="offset regression group={group} topic={topic} partition=0 current=5 '
        f'got=3"')


def test_batch_commit(addr, topic):
    group = f"g-{uuid.uuid4().hex[:6]}"
    member, gen = _member(addr, topic, group)
    base = f"BATCH_COMMIT topic={topic} group={group} member={member} generation={gen}"
    assert command(addr, base) == "ERROR: invalid_batch_commit_format"
    assert command(addr, f"{base} X0:1") == 'ERROR: invalid_batch_commit_entry entry="X0:1"'
    assert command(addr, f"{base} P0:1,P1") == 'ERROR: invalid_batch_commit_entry entry="P1"'
    assert command(addr, f"{base} Px:1") == 'ERROR: invalid_partition entry="Px:1"'
    assert command(addr, f"{base} P0:-1") == 'ERROR: invalid_offset entry="P0:-1"'
    assert command(addr, f"{base} P0:1,P0:2") == f"ERROR: duplicate_partition partition=0 group={group} topic={topic}"
    assert command(addr, f"BATCH_COMMIT topic={topic} group={group} member={member} P0:1") == (
        "ERROR: missing_generation command=BATCH_COMMIT")
    assert command(addr, f"{base} P0:10,P1:20") == "OK batched=2"
    # All or nothing: one bad entry and no partition moves.
    assert command(addr, f"{base} P0:11,P3:1") == f"ERROR: NOT_OWNER partition=3 member={member} group={group} generation={gen}"
    assert command(addr, f"{base} P0:12,P1:19").startswith("ERROR: offset_regression reason=")
    assert command(addr, f"FETCH_OFFSET topic={topic} partition=0 group={group}") == "OK offset=10"
    assert command(addr, f"BATCH_COMMIT {topic} {group} {member} {gen} P0:15,P1:25") == "OK batched=2"
    assert command(addr, f"FETCH_OFFSET topic={topic} partition=1 group={group}") == "OK offset=25"


def test_protocol_discovery_and_negotiation(addr):
    assert command(addr, "PROTOCOL_INFO") == (
        "OK protocol=cursus min_version=1 max_version=1 default_version=1 "
        "features=idempotent_producer_v1,offset_resume_v1,stream_control_v1 "
        "error_classes=authorization,availability,conflict,fencing,internal,not_found,routing,validation")
    assert command(addr, "NEGOTIATE version=1 features=stream_control_v1,structured_errors_v1") == (
        "OK protocol_version=1 enabled=stream_control_v1 unsupported=structured_errors_v1")
    assert command(addr, "NEGOTIATE version=1 features=*") == (
        "OK protocol_version=1 enabled=idempotent_producer_v1,offset_resume_v1,stream_control_v1 unsupported=")
    assert command(addr, "NEGOTIATE version=1 features=event_sourcing_v1 require_features=true") == (
        "ERROR: UNSUPPORTED_FEATURE features=event_sourcing_v1")
    assert command(addr, "NEGOTIATE version=2") == (
        "ERROR: UNSUPPORTED_PROTOCOL_VERSION requested=2 min_version=1 max_version=1")
    assert command(addr, "NEGOTIATE version=1 features=Bad-Name") == (
        'ERROR: invalid_features reason="invalid feature name Bad-Name"')


def test_gateway_cli_speaks_cursus(gw):
    exe = os.path.join(os.path.dirname(sys.executable), "gateway")
    server = ["--server", gw.address("cursus"), "--protocol", "cursus"]

    def cli(*args: str, stdin: str | None = None) -> str:
        done = subprocess.run([exe, *args, *server], input=stdin, text=True, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    name = f"cli-{uuid.uuid4().hex[:6]}"
    cli("topics", "create", name, "--partitions", "1")
    assert f"{name}\t1" in cli("topics", "list")
    cli("produce", name, "one", "two")
    cli("produce", name, stdin="three words\n")
    # partition, offset, key, value
    assert cli("consume", name) == "0\t0\t-\tone\n0\t1\t-\ttwo\n0\t2\t-\tthree words\n"
    assert cli("consume", name, "--offset", "1") == "0\t1\t-\ttwo\n0\t2\t-\tthree words\n"
    assert "0\t0\t3\t3" in cli("topics", "describe", name).splitlines()  # log start, high watermark, records
    cli("topics", "delete", name)
    assert name not in cli("topics", "list")

