"""The data dir's format version, its partition folder names, and the migration between formats.

The version lives in ``<data_dir>/FORMAT``, a one-line text file (``2``), rather than
in the metadata journal, because it must be read before anything else is opened:

- the journal's own encoding is what a future format may change, and replaying a
  journal truncates whatever it cannot parse as a torn tail: a gateway that had to
  replay a newer journal to find its version could destroy it on the way;
- ``cat FORMAT`` answers an operator (or a backup or upgrade script) without polygate;
- it is written once per format change, atomically (a temporary file, fsynced, renamed
  over, then the directory fsynced), never appended to or compacted.

Formats:

1. No ``FORMAT`` file (gateways before it existed). Partition ``P`` of a topic whose
   journal id is ``ID`` lives in ``logs/ID-P``.
2. ``FORMAT`` holds ``2``; partition folders show their topic: ``logs/NAME@ID-P``
   (``partition_dir_name``). The id stays in the name, so that a topic deleted and
   created again under its name never meets the folder of the one before.

A format-1 data dir is migrated when opened (``migrate``): each folder is renamed to
its new name, the ``logs`` directory is fsynced, and only then is ``FORMAT`` written.
A crash before that leaves a format-1 data dir some of whose folders already have
their new names; the next start renames the others (a folder found under its new
name counts as done), so it always completes.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable

from . import fileio

log = logging.getLogger(__name__)

CURRENT_FORMAT = 2
"""The format this gateway writes; it reads every format from 1 up to it."""
FORMAT_FILE = "FORMAT"
LOGS = "logs"
JOURNAL = "meta.journal"

MAX_NAME_CHARS = 180
"""Topic characters kept in a folder name: with ``@``, a 32-digit id, ``-`` and the
partition it stays under the 255 bytes a file name may have."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]")
_LEGACY_DIR = re.compile(r"[0-9a-f]{32}-[0-9]+")


class DataDirFormatError(Exception):
    """The data dir cannot be opened by this gateway (a newer or unknown format, or a
    migration that cannot go on); the message is one line, for the operator."""


def partition_dir_name(topic: str, topic_id: str, partition: int) -> str:
    """``NAME@ID-P``: the topic name with characters outside ``A-Z a-z 0-9 . _ = -`` (and a
    leading ``.``) replaced by ``_``, cut to ``MAX_NAME_CHARS``; the id keeps it unique."""
    shown = _UNSAFE.sub("_", topic[:MAX_NAME_CHARS])
    if shown.startswith("."):
        shown = "_" + shown[1:]
    return f"{shown}@{topic_id}-{partition}"


def legacy_partition_dir_name(topic_id: str, partition: int) -> str:
    """The folder of format 1: ``ID-P``."""
    return f"{topic_id}-{partition}"


def read_format(data_dir: str) -> int | None:
    """The data dir's format; ``None`` for a new one (nothing of polygate's in it yet).

    Raises ``DataDirFormatError`` for a ``FORMAT`` file this gateway cannot read or a
    format newer than ``CURRENT_FORMAT``.
    """
    path = os.path.join(data_dir, FORMAT_FILE)
    try:
        with open(path, "rb") as f:
            text = f.read(256)
    except FileNotFoundError:
        logs = os.path.join(data_dir, LOGS)
        has_logs = os.path.isdir(logs) and any(True for _ in os.scandir(logs))
        return 1 if has_logs or os.path.exists(os.path.join(data_dir, JOURNAL)) else None
    first = text.split(b"\n", 1)[0].strip()
    if not (first.isdigit() and first.isascii() and 0 < int(first) < 1 << 31):
        raise DataDirFormatError(
            f"data dir {data_dir}: {FORMAT_FILE} holds {first[:40]!r}, not a data format polygate knows "
            f"(this one reads formats 1 to {CURRENT_FORMAT})")
    version = int(first)
    if version > CURRENT_FORMAT:
        raise DataDirFormatError(
            f"data dir {data_dir} has format {version}, newer than this polygate reads (1 to {CURRENT_FORMAT}): "
            f"run the polygate that wrote it or a newer one, or restore a backup taken before the upgrade")
    return version


def write_format(data_dir: str, version: int, file_mode: int) -> None:
    """Write ``FORMAT`` atomically and durably: a temporary file, fsynced, renamed over, the dir fsynced."""
    path = os.path.join(data_dir, FORMAT_FILE)
    tmp = path + ".tmp"
    fileio.write_new_file(tmp, [[f"{version}\n".encode()]], file_mode)
    os.replace(tmp, path)
    fileio.fsync_dir(data_dir)


def migrate(data_dir: str, version: int, topics: Iterable[tuple[str, str, int]], file_mode: int) -> None:
    """Bring a data dir of ``version`` to ``CURRENT_FORMAT``; ``topics`` are the journal's
    ``(name, id, partitions)``. Safe to interrupt at any point and run again."""
    if version == 1:
        _migrate_1_to_2(data_dir, topics)
        version = 2
    write_format(data_dir, version, file_mode)


def _migrate_1_to_2(data_dir: str, topics: Iterable[tuple[str, str, int]]) -> None:
    logs = os.path.join(data_dir, LOGS)
    renamed = 0
    for name, topic_id, partitions in topics:
        for p in range(partitions):
            old = os.path.join(logs, legacy_partition_dir_name(topic_id, p))
            new = os.path.join(logs, partition_dir_name(name, topic_id, p))
            if not os.path.isdir(old):
                continue  # renamed by an interrupted migration, or never written
            if os.path.lexists(new):
                raise DataDirFormatError(
                    f"data dir {data_dir}: cannot migrate to format 2: both {old} and {new} exist "
                    f"(was a gateway older than format 2 started on it?); keep the one with the data, "
                    f"move the other away, and start again")
            os.rename(old, new)
            renamed += 1
    if os.path.isdir(logs):
        fileio.fsync_dir(logs)  # the renames are durable before FORMAT says they were made
    log.info("data dir %s: migrated from format 1 to 2 (%d partition folders renamed to NAME@ID-P)",
                data_dir, renamed)


def unknown_entries(data_dir: str, expected: set[str]) -> list[str]:
    """Entries of ``logs`` that are no partition of a topic in the journal (sorted)."""
    logs = os.path.join(data_dir, LOGS)
    try:
        names = os.listdir(logs)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n not in expected)


def describe_unknown(names: list[str]) -> str:
    """Why such entries may be there, for the start-up warning."""
    legacy = [n for n in names if _LEGACY_DIR.fullmatch(n)]
    why = ("folders of topics deleted while the gateway stopped, or written by a gateway older than "
           "format 2" if legacy else "folders of topics deleted while the gateway stopped")
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"{len(names)} entries belong to no topic and are not read ({why}): {shown}"
