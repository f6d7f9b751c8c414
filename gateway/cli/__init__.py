"""``gateway``, the command line: ``serve`` (``main``), the client commands (``client``), users and
ACLs (``security``), and what they share (``credentials``, ``logs``)."""
