"""Cluster mode: the storage interface on an existing Kafka-compatible cluster.

``gateway serve --storage kafka://HOST:PORT`` keeps nothing that matters on
local disk: topics, records, offsets, watermarks, consumer groups and
committed offsets are the cluster's own, so any number of gateways can
serve the same cluster and a gateway can die without losing an
acknowledged record. The pieces (each with its own thread for librdkafka's
blocking calls, handing results to the reactor thread):

* ``metadata``: topics, ids and watermarks, refreshed every second, and whether the
  cluster answers (probed four times a second; ``/readyz`` follows it);
* ``clientlog``: librdkafka's log lines in the gateway's log, a repeat held back;
* ``writer``: appends, through librdkafka producers with the produce's acks;
* ``reader``: reads and waits for new records, through one assign-only consumer;
* ``groups``: V1/Cursus members as members of real consumer groups, and commits;
* ``store``: ``ClusterStore``, the ``Storage`` the broker talks to.

librdkafka (confluent-kafka) is the cluster client: it handles metadata,
leader changes, retries, idempotence, compression, SASL and TLS.
"""

from gateway.cluster.config import ClusterConfig, parse_properties, parse_storage
from gateway.cluster.store import ClusterStore

__all__ = ["ClusterConfig", "ClusterStore", "parse_properties", "parse_storage"]
