"""``gateway serve`` refuses bad codec options at start: one line, exit code 2, nothing opened."""

from __future__ import annotations

import os
import subprocess

import pytest

from gateway.launcher import GATEWAY


def serve(tmp_path, *args: str) -> subprocess.CompletedProcess:
    data_dir = tmp_path / "data"
    done = subprocess.run([GATEWAY, "serve", "--admin", "none", "--data-dir", str(data_dir), "--protocols", "cursus,v1",
                           "--listen", "cursus=127.0.0.1:0", "--listen", "v1=127.0.0.1:0", *args],
                          capture_output=True, text=True, timeout=60)
    assert not os.path.exists(data_dir)  # refused before storage was opened
    return done


@pytest.mark.parametrize(("option", "expected"), [
    ("cursus.compression=zstd",
     "polygate: codec cursus: option compression='zstd' is not allowed; expected one of none, gzip, snappy, lz4"),
    ("cursus.stream_keepalive_ms=soon",
     "polygate: codec cursus: option stream_keepalive_ms='soon' is not allowed; "
     "expected a whole number of milliseconds, at least 1"),
    ("cursus.keepalive=5",
     "polygate: codec cursus: unknown option 'keepalive' (its options: compression, stream_keepalive_ms)"),
    ("tank.x=1", "polygate: codec tank: --codec-option given for a codec that is not served (served: cursus, v1)"),
    ("v1.x=1", "polygate: codec v1: unknown option 'x' (its options: none)"),
])
def test_a_bad_codec_option_stops_the_start_with_one_line(tmp_path, option, expected):
    done = serve(tmp_path, "--codec-option", option)
    assert (done.returncode, done.stderr.splitlines(), done.stdout) == (2, [expected], "")
