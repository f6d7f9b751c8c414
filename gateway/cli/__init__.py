"""``gateway``, the command line: the group (``main``), ``serve`` (``serve``), the client commands
(``client``), users and ACLs (``security``), and what they share (``credentials``, ``logs``)."""
