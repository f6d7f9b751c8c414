"""The transaction coordinator at a producer's last epochs (``gateway.broker.transactions``): an
EndTxn v5 (KIP-890 part 2) whose next epoch would be Kafka's largest (32767) writes its markers under
that epoch and answers a new producer id at epoch 0, as Kafka's coordinator does; its retry gets the
same answer; the producer id given up is no longer the transactional id's; it holds across a restart."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from twisted.internet import defer

from gateway import model as m
from gateway.broker import Broker
from gateway.broker.transactions import MAX_EPOCH, Txn
from gateway.local.store import LocalStore
from gateway.model import ErrorCode
from gateway.registry import Registry
from gateway.storage.engine import Engine
from gateway.testing import Reactor

FORMATS = Registry.discover().batch_formats
TXN = "tx"


def now(result):
    """``result``, which is at hand: a value, or a Deferred that has fired."""
    if isinstance(result, defer.Deferred):
        assert result.called, "the answer waits"
        return result.result
    return result


class Gateway:
    """A broker over a local engine in ``path``, started; ``restart`` builds it again from the engine's journal."""

    def __init__(self, path: str):
        self.path = path
        self.engine: Engine | None = None
        self.broker: Broker | None = None
        self.restart()

    def restart(self) -> None:
        self.close()
        self.engine = Engine(self.path)
        self.broker = Broker(LocalStore(self.engine, Reactor()), FORMATS, Reactor())
        self.broker.start()

    def run(self, command):
        assert self.broker is not None
        return now(self.broker.run(command))

    def close(self) -> None:
        if self.broker is not None:
            self.broker.stop()
        if self.engine is not None:
            self.engine.close()


@pytest.fixture
def gateway(tmp_path) -> Iterator[Gateway]:
    gw = Gateway(str(tmp_path))
    yield gw
    gw.close()


def at_epoch(gw: Gateway, epoch: int) -> int:
    """The transactional id's producer, as a gateway restarted with it at ``epoch`` has it: its id."""
    assert gw.engine is not None
    producer_id = gw.engine.allocate_producer_id()
    gw.engine.put_record("txn", f"id:{TXN}", Txn(TXN, producer_id, epoch, 60_000, "CompleteCommit").record())
    gw.restart()
    return producer_id


def transaction(gw: Gateway, producer_id: int, epoch: int) -> None:
    added = gw.run(m.AddPartitionsToTxn(TXN, producer_id, epoch, (("t", 0),)))
    assert added.errors == (("t", 0, None),)


def end(gw: Gateway, producer_id: int, epoch: int, commit: bool = True) -> tuple[ErrorCode | None, int, int]:
    r = gw.run(m.EndTxn(TXN, producer_id, epoch, commit, bump_epoch=True))
    return (r.error.code if r.error else None), r.producer_id, r.epoch


def markers(gw: Gateway) -> list[tuple[int, int]]:
    """The producer id and epoch of each control batch (marker) of t/0."""
    fetched = gw.run(m.Fetch("t", 0, 0, "kafka", read_committed=False))
    producers = [FORMATS["kafka"].batch_producer(b.payload) for b in fetched.batches]
    return [(p.producer_id, p.epoch) for p in producers if p.control]


def test_an_end_at_the_last_epoch_answers_a_new_producer_id_at_epoch_0(gateway):
    gateway.run(m.CreateTopic("t", 1))
    old = at_epoch(gateway, MAX_EPOCH)
    transaction(gateway, old, MAX_EPOCH)
    error, producer_id, epoch = end(gateway, old, MAX_EPOCH)
    assert (error, epoch) == (None, 0) and producer_id not in (old, -1)
    assert end(gateway, old, MAX_EPOCH) == (None, producer_id, 0), "a retry gets the same answer"
    assert gateway.run(m.AddPartitionsToTxn(TXN, old, MAX_EPOCH, (("t", 0),))).error.code is \
        ErrorCode.INVALID_PRODUCER_ID_MAPPING, "the producer id given up is not the transactional id's any more"

    gateway.restart()
    assert end(gateway, old, MAX_EPOCH) == (None, producer_id, 0), "kept across a restart"
    transaction(gateway, producer_id, 0)
    assert end(gateway, producer_id, 0, commit=False) == (None, producer_id, 1)


def test_an_end_before_the_last_epochs_keeps_the_producer_id(gateway):
    gateway.run(m.CreateTopic("t", 1))
    producer_id = at_epoch(gateway, MAX_EPOCH - 1)
    transaction(gateway, producer_id, MAX_EPOCH - 1)
    assert end(gateway, producer_id, MAX_EPOCH - 1) == (None, producer_id, MAX_EPOCH)


def test_the_markers_of_an_end_at_the_last_epoch_carry_kafkas_largest_epoch(gateway):
    gateway.run(m.CreateTopic("t", 1))
    old = at_epoch(gateway, MAX_EPOCH)
    transaction(gateway, old, MAX_EPOCH)
    end(gateway, old, MAX_EPOCH)
    assert markers(gateway) == [(old, 32_767)]
