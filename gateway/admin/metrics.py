"""The gateway's Prometheus metrics: collectors that read the counters (``gateway.stats``)
and storage when ``/metrics`` is scraped.

Nothing here runs while the gateway serves: the adapter and the broker count in
plain Python objects, and ``ServingCollector`` turns them into metric families at
scrape time. ``StorageCollector`` reads partitions and group offsets through the
storage interface (``gateway.storage.interface.Storage``), which may answer later
(a cluster): ``refresh()`` gathers them first, then the registry is rendered.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import attrs
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from twisted.internet import defer

from gateway import __version__
from gateway.admin.overview import (
    GROUPS_TIMEOUT_S,
    PartitionView,
    committed_offsets,
    group_names,
    read_partitions,
)
from gateway.stats import BrokerStats, Histogram, ListenerStats
from gateway.storage.interface import SyncingStorage

if TYPE_CHECKING:
    from gateway.server import Gateway

log = logging.getLogger(__name__)

LISTENER = ("listener", "protocol")


def _histogram(name: str, doc: str, labels: tuple[str, ...]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


def _add_histogram(family: HistogramMetricFamily, values: list[str], hist: Histogram) -> None:
    family.add_metric(values, hist.cumulative(), hist.sum)


class ServingCollector:
    """Per listener and protocol: connections, requests, commands by result, bytes,
    latency, records produced and fetched, failed authentications; the broker's
    fsyncs, storage errors and conversions."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway

    def collect(self) -> Iterator[Metric]:
        gw = self.gateway
        info = GaugeMetricFamily("polygate_info", "The gateway's version and storage (always 1).",
                                 labels=("version", "storage"))
        info.add_metric([__version__, "local" if gw.cluster is None else f"kafka://{gw.cluster.bootstrap}"], 1)
        yield info
        yield from self._listeners()
        if gw.broker is not None:
            yield from self._broker(gw.broker.stats)

    def _listeners(self) -> Iterator[Metric]:
        def counter(name: str, doc: str, labels: tuple[str, ...] = LISTENER) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=labels)

        open_ = GaugeMetricFamily("polygate_connections_open", "Connections open now.", labels=LISTENER)
        total = counter("polygate_connections", "Connections accepted.")
        refused = counter("polygate_connections_refused", "Connections closed at accept: over a connection limit.")
        requests = counter("polygate_requests", "Client requests: those that ran commands, and those the "
                                                "codec answered alone (kind=reply: a handshake, a parse error).",
                           (*LISTENER, "kind"))
        commands = counter("polygate_commands", "Commands client requests ran, by command and result (ok or the "
                                                "error code); a request for 3 partitions runs 3.",
                           (*LISTENER, "command", "result"))
        received = counter("polygate_received_bytes", "Bytes received from clients.")
        sent = counter("polygate_sent_bytes", "Bytes sent to clients.")
        latency = _histogram("polygate_request_duration_seconds",
                             "From a request read to its answer written; waited=true: requests that waited "
                             "(long polls, acks=all, fsync always, a cluster).", (*LISTENER, "waited"))
        produced = counter("polygate_produced_records", "Records produced (acknowledged without error).")
        produced_bytes = counter("polygate_produced_bytes", "Bytes of the record batches produced.")
        fetched = counter("polygate_fetched_records", "Records sent to readers (fetches and push streams).")
        fetched_bytes = counter("polygate_fetched_bytes", "Bytes of the record batches sent to readers.")
        auth = counter("polygate_authentication_failures", "Failed logins (SASL, MQTT CONNECT, Cursus AUTH).")
        dropped = counter("polygate_push_dropped_messages", "Messages a subscriber that did not read lost "
                                                            "(MQTT QoS 0).")
        for factory in list(self.gateway.factories):
            s: ListenerStats = factory.meter
            labels = [s.address, s.protocol]
            open_.add_metric(labels, len(factory.connections))
            total.add_metric(labels, s.connections_total)
            refused.add_metric(labels, factory.refused)
            requests.add_metric([*labels, "commands"], s.requests)
            requests.add_metric([*labels, "reply"], s.replies)
            failed: dict[type, int] = {}
            for (kind, code), n in sorted(s.errors.items(), key=lambda item: (item[0][0].__name__, item[0][1])):
                commands.add_metric([*labels, kind.__name__, code], n)
                failed[kind] = failed.get(kind, 0) + n
            for kind, n in sorted(s.commands.items(), key=lambda item: item[0].__name__):
                commands.add_metric([*labels, kind.__name__, "ok"], n - failed.get(kind, 0))
            received.add_metric(labels, s.bytes_in)
            sent.add_metric(labels, s.bytes_out)
            _add_histogram(latency, [*labels, "false"], s.latency)
            _add_histogram(latency, [*labels, "true"], s.latency_waited)
            produced.add_metric(labels, s.records_produced)
            produced_bytes.add_metric(labels, s.bytes_produced)
            fetched.add_metric(labels, s.records_fetched)
            fetched_bytes.add_metric(labels, s.bytes_fetched)
            auth.add_metric(labels, s.auth_failures)
            dropped.add_metric(labels, factory.stats["push_dropped"])
        yield from (open_, total, refused, requests, commands, received, sent, latency, produced, produced_bytes,
                    fetched, fetched_bytes, auth, dropped)

    def _broker(self, stats: BrokerStats) -> Iterator[Metric]:
        fsync = _histogram("polygate_fsync_duration_seconds", "fsyncs of the data and metadata files "
                                                              "(_count: how many).", ())
        _add_histogram(fsync, [], stats.fsync_seconds)
        yield fsync
        yield CounterMetricFamily("polygate_fsync_failures", "fsyncs that failed (the files are fenced).",
                                  stats.fsync_failures)
        errors = CounterMetricFamily("polygate_storage_errors", "Storage failures, by operation: fsync, or the "
                                                                "command answered STORAGE_ERROR.",
                                     labels=("operation",))
        for operation, n in sorted(stats.storage_errors.items()):
            errors.add_metric([operation], n)
        yield errors
        records = CounterMetricFamily("polygate_converted_records", "Records converted from one storage format to "
                                                                    "another for a reader (cache misses).",
                                      labels=("from", "to"))
        seconds = CounterMetricFamily("polygate_conversion_seconds", "Time spent converting records between "
                                                                     "formats.", labels=("from", "to"))
        for pair, n in sorted(stats.converted_records.items()):
            records.add_metric(list(pair), n)
            seconds.add_metric(list(pair), stats.conversion_seconds.get(pair, 0.0))
        yield records
        yield seconds


@attrs.frozen
class Snapshot:
    """What storage said at the last refresh."""

    available: bool = False
    partitions: tuple[PartitionView, ...] = ()
    offsets: tuple[tuple[str, str, int, int], ...] = ()  # (group, topic, partition, committed offset)
    groups_known: bool = False  # False: the group offsets were not read (the storage did not answer in time)
    fenced: frozenset[tuple[str, int]] = frozenset()  # partitions a failed fsync fenced until restart


class StorageCollector:
    """Per partition: log start, log end, high watermark, bytes on disk; per group and
    partition: committed offset and lag; read through the storage interface by ``refresh``."""

    def __init__(self, gateway: Gateway, reactor: Any):
        self.gateway = gateway
        self.reactor = reactor
        self.snapshot = Snapshot()

    @defer.inlineCallbacks
    def refresh(self) -> Any:
        """Read storage now (waiting at most ``GROUPS_TIMEOUT_S`` for a cluster's group offsets)."""
        broker = self.gateway.broker
        if broker is None:
            self.snapshot = Snapshot()
            return
        store = broker.store
        if store.unavailable() is not None:
            self.snapshot = Snapshot(available=False)
            return
        partitions = read_partitions(store)
        try:
            offsets = yield group_names(store).addCallback(lambda names: committed_offsets(store, names)).addTimeout(
                GROUPS_TIMEOUT_S, self.reactor)
            known = True
        except Exception as e:  # noqa: BLE001 - a scrape reports what it could read
            log.warning("metrics: group offsets not read: %s", e)
            offsets, known = (), False
        fenced = frozenset(cast(SyncingStorage, store).fenced()) if store.syncs else frozenset()
        self.snapshot = Snapshot(True, tuple(partitions), tuple(offsets), known, fenced)

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        yield GaugeMetricFamily("polygate_storage_available", "Whether storage answers (in cluster mode: the "
                                                              "cluster is reachable).", int(snap.available))
        part = ("topic", "partition")
        start = GaugeMetricFamily("polygate_partition_log_start_offset", "The first offset still stored.",
                                  labels=part)
        end = GaugeMetricFamily("polygate_partition_log_end_offset", "The offset the next record gets.",
                                labels=part)
        high = GaugeMetricFamily("polygate_partition_high_watermark", "The offset after the last record "
                                                                      "readers may see.", labels=part)
        size = GaugeMetricFamily("polygate_partition_size_bytes", "Bytes the partition's log takes on local "
                                                                  "disk (none in cluster mode).", labels=part)
        fenced = GaugeMetricFamily("polygate_partition_fenced", "1 for a partition an fsync failure fenced: it "
                                                               "refuses writes until the gateway restarts.",
                                   labels=part)
        marks: dict[tuple[str, int], int] = {}
        for p in snap.partitions:
            labels = [p.topic, str(p.partition)]
            fenced.add_metric(labels, int((p.topic, p.partition) in snap.fenced))
            start.add_metric(labels, p.log_start_offset)
            end.add_metric(labels, p.log_end_offset)
            high.add_metric(labels, p.high_watermark)
            if p.size is not None:
                size.add_metric(labels, p.size)
            marks[(p.topic, p.partition)] = p.high_watermark
        yield from (start, end, high, size, fenced)
        group = ("group", "topic", "partition")
        committed = GaugeMetricFamily("polygate_group_committed_offset", "The offset a group committed for a "
                                                                         "partition.", labels=group)
        lag = GaugeMetricFamily("polygate_group_lag", "Records of a partition after a group's committed offset "
                                                      "(high watermark - committed).", labels=group)
        for name, topic, partition, offset in snap.offsets:
            labels = [name, topic, str(partition)]
            committed.add_metric(labels, offset)
            high_watermark = marks.get((topic, partition))
            if high_watermark is not None:
                lag.add_metric(labels, max(high_watermark - offset, 0))
        yield committed
        yield lag
        yield GaugeMetricFamily("polygate_group_offsets_read", "Whether the last scrape read the groups' offsets.",
                                int(snap.groups_known))
