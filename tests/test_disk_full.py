"""A real full disk: an 8 MiB tmpfs the test mounts (root only; skipped, saying why, otherwise).

Produce and commit until the disk is full, free space, restart: every acknowledged
record and commit is there, and nothing acknowledged was cut off as a torn tail.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from gateway.clients.v1 import V1Client

RECORD = "x" * 1000


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def _fill(path: str, leave: int) -> None:
    """Write ``path`` until the filesystem has about ``leave`` bytes free."""
    st = os.statvfs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"\0" * max(st.f_bavail * st.f_frsize - leave, 0))


@pytest.mark.parametrize("fsync", ["always", "interval:50"])
def test_every_acknowledged_record_and_commit_survives_a_full_disk(gateway_factory, small_disk, fsync):
    gw = gateway_factory(("v1",), ("--fsync", fsync), data_dir=small_disk / "data")
    acked: dict[tuple[int, int], str] = {}
    committed: dict[int, int] = {}
    refused: set[str] = set()
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.create_topic("t", 2)
        generation = c.request("JOIN", "g", "t", "m1").check().fields["generation"]
        filler = str(small_disk / "filler")
        _fill(filler, leave=300_000)
        n = 0
        failed_rounds = 0
        while failed_rounds < 3:
            batch = [("PRODUCE", "t", f"k{i}:{i}-{RECORD}") for i in range(n, n + 20)]
            replies = c.pipeline(batch)
            for (_, _, message), r in zip(batch, replies, strict=True):
                if r.ok:
                    f = r.fields
                    acked[(int(f["partition"]), int(f["offset"]))] = message.split(":", 1)[1]
                else:
                    refused.add(r.code)
            n += 20
            progress = any(r.ok for r in replies)
            for p in (0, 1):
                offset = str(n + p)
                r = c.request("COMMIT", "g", "t", "m1", generation, str(p), offset)
                if r.ok:
                    committed[p] = int(offset)
                    progress = True
                else:
                    refused.add(r.code)
            failed_rounds = 0 if progress else failed_rounds + 1
        assert refused == {"STORAGE_ERROR"}, "a full disk is a storage error"
        assert len(acked) > 100 and len(committed) == 2
        assert c.request("ADMIN_CREATE_TOPIC", "full", "1", "1").code == "STORAGE_ERROR"

        os.unlink(filler)  # space comes back: the undone writes did not fence anything
        r = c.request("PRODUCE", "t", f"after:{RECORD}").check()
        acked[(int(r.fields["partition"]), int(r.fields["offset"]))] = RECORD
        c.request("COMMIT", "g", "t", "m1", generation, "0", "999999").check()
        committed[0] = 999999
    gw.assert_alive()

    gw.restart()
    assert "torn" not in gw.log, gw.log
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        stored = {(p, offset): value for p in (0, 1) for offset, value in c.consume_all("t", p)}
        assert stored == acked
        for p, offset in committed.items():
            assert c.request("OFFSET", "g", "t", str(p)).check().fields["offset"] == str(offset)
