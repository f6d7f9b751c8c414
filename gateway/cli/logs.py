"""Where ``gateway serve`` logs, and in which form.

One line per event that matters (a listener up, a connection accepted or closed,
a topic created or deleted, a group's new generation, storage errors); DEBUG adds
every request's commands. ``text`` is ``time level logger: message``; ``json``
is one object per line (``time``, ``level``, ``logger``, ``message``, and
``error`` with the traceback when there is one), for log shippers. Twisted's own
informational chatter (ports starting and stopping) is kept below INFO.
"""

from __future__ import annotations

import json
import logging
import sys
import time

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str, fmt: str = "text", path: str | None = None) -> None:
    """Send every log record at ``level`` or above to ``path`` (stderr if ``None``), as ``fmt``.

    Raises ``OSError`` if ``path`` cannot be opened for appending."""
    handler: logging.Handler = logging.FileHandler(path, encoding="utf-8") if path else logging.StreamHandler(
        sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # Twisted logs ports starting and stopping at INFO: detail, not events
    logging.getLogger("twisted").setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
