"""TLS for tests: a CA and the certificates it signs, made with the ``openssl`` command, and a TLS proxy.

``TlsProxy(target_port, cert, key)`` accepts TLS connections on ``port`` and
forwards the plain bytes to ``127.0.0.1:target_port``: put in front of a Kafka
broker that advertises the proxy's port, it makes a cluster that clients must
reach over TLS.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from gateway.launcher import free_port


def _openssl(*args: str) -> None:
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make test certificates")
    subprocess.run(["openssl", *args], check=True, capture_output=True)


# P-256 keys: every client the tests run accepts them, and making one costs a fraction of an RSA
# key's CPU, which the test processes of the parallel pass otherwise spend dozens of times over.
NEW_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256")


class Pki:
    """A test CA in ``directory``, and certificates it signs: ``issue(name, cn)`` returns
    ``(cert.pem, key.pem)``, a server certificate for localhost and 127.0.0.1 unless ``client``."""

    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca, self.ca_key = directory / "ca.pem", directory / "ca.key"
        _openssl("req", "-x509", *NEW_KEY, "-nodes", "-keyout", str(self.ca_key), "-out", str(self.ca),
                 "-days", "2", "-subj", "/CN=polygate test CA")

    def issue(self, name: str, cn: str = "localhost", client: bool = False) -> tuple[Path, Path]:
        cert, key, csr = (self.directory / f"{name}.{ext}" for ext in ("pem", "key", "csr"))
        ext = self.directory / f"{name}.ext"
        ext.write_text("extendedKeyUsage=clientAuth\n" if client else
                       "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
        _openssl("req", *NEW_KEY, "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={cn}")
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(self.ca_key),
                 "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))
        return cert, key

    def context(self, client_cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        """A client's context that trusts this CA (and shows ``client_cert`` if given)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if client_cert is not None:
            context.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
        return context


class TlsProxy:
    """TLS on ``port`` in front of plain TCP on ``target_port``, served by an asyncio loop in a thread."""

    def __init__(self, target_port: int, cert: Path, key: Path):
        self.target_port = target_port
        self.port = free_port()
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(str(cert), str(key))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.AbstractServer | None = None

    def __enter__(self) -> TlsProxy:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.context), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
