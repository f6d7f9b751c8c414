"""The local store: the embedded engine (``gateway.storage``) behind the ``Storage`` interface,
with the reactor-side parts it needs (the Kafka rebalance barrier)."""
