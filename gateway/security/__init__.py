"""Who a client is and what it may do, the same for every protocol.

``users``: the user store every listener authenticates against (SCRAM
credentials, never passwords). ``acl``: Kafka's ACL model and its decisions.
Neither imports Twisted or storage: codecs read the user store through
``ListenerSettings.users``; the broker (``gateway.broker.access`` and
``gateway.broker.security``) enforces the ACLs and persists both.
"""
