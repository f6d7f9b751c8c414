"""The local store: the embedded engine (``gateway.storage``) behind the ``Storage`` interface,
with the group coordinator over it (``groups``, which needs the reactor for Kafka's rebalances)."""
