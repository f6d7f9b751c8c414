"""Write ``format1-datadir.tar.gz``: a data dir written by the storage engine of format 1
(before the ``FORMAT`` file; partition folders ``logs/<topic-id>-<partition>``).

It runs that engine's own code, taken from git, not a rebuilt copy of its layout::

    .venv/bin/python tests/data/make_format1_datadir.py [COMMIT]

COMMIT defaults to 42b10ac, the last commit of format 1. What it holds (checked by
``tests/test_data_dir.py``): topic ``orders`` (3 partitions, partition 0 over several
segments; records in the ``v1`` format, so that V1 clients read them), ``a.b_c=d``
(1 partition), ``again`` (deleted and created again: a new id), ``gone`` (its deletion
journaled, its folder left behind as by a crash before the folder was removed), group
``billing``'s committed offsets, a producer id and user ``alice`` (password
``alice-secret``, SCRAM-SHA-256).
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TS = 1_700_000_000_000
MODULES = ("__init__", "engine", "fileio", "groups", "interface", "journal", "log", "replication", "segment")


def main(commit: str = "42b10ac") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        package = os.path.join(tmp, "format1_storage")
        os.mkdir(package)
        for name in MODULES:
            source = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:storage/{name}.py"],
                                    check=True, capture_output=True).stdout
            with open(os.path.join(package, f"{name}.py"), "wb") as f:
                f.write(source)
        sys.path.insert(0, tmp)
        from format1_storage.engine import Engine, EngineConfig

        from gateway.broker.security import encode_credentials
        from gateway.security.users import from_password

        data = os.path.join(tmp, "data")
        clock = iter(range(1_700_000_000, 1_800_000_000))
        engine = Engine(data, EngineConfig(segment_bytes=256), clock=lambda: float(next(clock)))
        engine.create_topic("orders", 3)
        for p in range(3):
            for i in range(20 if p == 0 else 3):
                engine.append("orders", p, "v1", v1_record(f"k{i}", f"order-{p}-{i}-" + "x" * 60), 1, TS + i)
        engine.create_topic("a.b_c=d", 1)
        engine.append("a.b_c=d", 0, "v1", v1_record("k", "dotted"), 1, TS)
        engine.create_topic("again", 1)
        engine.append("again", 0, "v1", v1_record("k", "first-life"), 1, TS)
        engine.delete_topic("again")
        engine.create_topic("again", 1)
        engine.append("again", 0, "v1", v1_record("k", "second-life"), 1, TS)
        engine.create_topic("gone", 1)
        engine.append("gone", 0, "v1", v1_record("k", "deleted"), 1, TS)
        engine.journal.append({"t": "topic-del", "name": "gone"})  # and a crash before its folder went
        engine.save_offset("billing", "orders", 0, 7, "meta")
        engine.save_offset("billing", "orders", 2, 1)
        engine.allocate_producer_id()
        engine.put_record("sec", "user:alice", encode_credentials(
            {"SCRAM-SHA-256": from_password("SCRAM-SHA-256", "alice-secret", 4096)}))
        engine.close()
        os.unlink(os.path.join(data, ".lock"))
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:gz") as tar:
            tar.add(data, arcname="data", filter=_reset)
        with open(os.path.join(HERE, "format1-datadir.tar.gz"), "wb") as f:
            f.write(out.getvalue())


def v1_record(key: str, value: str) -> bytes:
    """One record in the ``v1`` storage format (``codecs/v1/format.py``), as a V1 PRODUCE stores it."""
    k, v = key.encode(), value.encode()
    return struct.pack(">Iqi", 0, TS, len(k)) + k + struct.pack(">i", len(v)) + v


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 1_700_000_000
    return info


if __name__ == "__main__":
    main(*sys.argv[1:])
