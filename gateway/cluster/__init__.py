"""Cluster mode: the storage interface on an existing Kafka-compatible cluster.

``gateway serve --storage kafka://HOST:PORT`` keeps nothing that matters on
local disk: topics, records, offsets, watermarks, consumer groups and
committed offsets are the cluster's own, so any number of gateways can
serve the same cluster and a gateway can die without losing an
acknowledged record. The pieces:

* ``wire``: the gateway's own Kafka client, in the reactor thread, for the
  data path: record batches go to the cluster and come back as the bytes
  they are (librdkafka takes and gives records one by one);
* ``writer``: appends, one Kafka record batch each, through an idempotent
  producer of the gateway's own for acks=all;
* ``reader``: reads and waits for new records, from fetched batches;
* ``producers``: idempotent producers' state, read back from the batches;
* ``metadata``: topics, ids and watermarks, asked every second through ``wire`` (whose
  leaders come from the same answers), and whether the cluster answers (probed four times a
  second; ``/readyz`` follows it);
* ``clientlog``: librdkafka's log lines in the gateway's log, a repeat held back;
* ``groups``: V1/Cursus members as members of real consumer groups, and commits;
* ``coordinator``: requests to the cluster's group and transaction coordinators;
* ``transactions``: Kafka transactions through the cluster's coordinator, the
  client's transactional batches sent as they are (re-stamped with the
  cluster's producer);
* ``store``: ``ClusterStore``, the ``Storage`` the broker talks to.

librdkafka (confluent-kafka) serves what is off the data path, each client
with its own threads, handing results to the reactor thread: the admin calls
(topics created, deleted and altered, offsets by timestamp, groups described),
group membership.
"""

from gateway.cluster.config import ClusterConfig, parse_properties, parse_storage

# ``ClusterStore`` is imported from ``gateway.cluster.store`` by who uses it: this package is
# imported by every ``gateway serve`` for its settings, and a local-mode one needs no more of it.
__all__ = ["ClusterConfig", "parse_properties", "parse_storage"]
