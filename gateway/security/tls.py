"""TLS on listeners: Twisted's TLS over pyOpenSSL, with certificates that reload.

``TlsConfig`` names the PEM files and how clients authenticate
(``client_auth``: ``none``; ``optional``, a certificate is checked if the
client sends one; ``required``, a client without a certificate the CA signed
is refused in the handshake). ``ReloadableTls`` is the connection creator of
every TLS listener: each new connection uses the certificate loaded last and
connections already open keep theirs, so ``reload()`` (on SIGHUP) changes
certificates without dropping anyone. A file that fails to load leaves the
certificate in use as it was, and ``reload`` says why.

The listeners negotiate no application protocol (ALPN): a client that offers some (every
browser, curl, Python's HTTP clients offer ``http/1.1``) gets none and goes on, as RFC 7301
lets a server answer. Twisted's own ALPN callback instead answers such a client with an
internal error alert when nothing matches, which refused every HTTPS client.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
from OpenSSL import SSL, crypto
from twisted.internet import ssl
from twisted.internet.interfaces import IOpenSSLServerConnectionCreator
from twisted.protocols.tls import TLSMemoryBIOFactory
from zope.interface import implementer

log = logging.getLogger(__name__)

CLIENT_AUTH = ("none", "optional", "required")
PEM_END = b"-----END CERTIFICATE-----"


@attrs.frozen
class TlsConfig:
    cert: str  # the server's certificate, then any intermediates (PEM)
    key: str  # its private key (PEM)
    ca: str | None = None  # CAs whose client certificates are accepted (PEM); needed unless client_auth is none
    client_auth: str = "none"

    def __attrs_post_init__(self) -> None:
        if self.client_auth not in CLIENT_AUTH:
            raise ValueError(f"client auth {self.client_auth!r}: expected one of {', '.join(CLIENT_AUTH)}")
        if self.client_auth != "none" and not self.ca:
            raise ValueError(f"client auth {self.client_auth} needs the CA that signs client certificates (--tls-ca)")


def _certificates(path: str) -> list[crypto.X509]:
    with open(path, "rb") as f:
        data = f.read()
    pems = [part.strip() + b"\n" + PEM_END + b"\n" for part in data.split(PEM_END) if part.strip()]
    try:
        certs = [crypto.load_certificate(crypto.FILETYPE_PEM, pem) for pem in pems]
    except crypto.Error as e:
        raise ValueError(f"{path}: not a PEM certificate ({e})") from None
    if not certs:
        raise ValueError(f"{path}: no certificate")
    return certs


def load(config: TlsConfig) -> ssl.CertificateOptions:
    """Options made from the files now: raises ``OSError`` or ``ValueError`` naming the problem."""
    chain = _certificates(config.cert)
    try:
        with open(config.key, "rb") as f:
            key = crypto.load_privatekey(crypto.FILETYPE_PEM, f.read())
    except crypto.Error as e:
        raise ValueError(f"{config.key}: not a PEM private key ({e})") from None
    verify = config.client_auth != "none"
    options = ssl.CertificateOptions(
        privateKey=key, certificate=chain[0], extraCertChain=chain[1:],
        verify=verify, caCerts=_certificates(config.ca) if verify and config.ca is not None else None,
        requireCertificate=config.client_auth == "required", raiseMinimumTo=ssl.TLSVersion.TLSv1_2)
    context = options.getContext()
    try:
        context.check_privatekey()
    except SSL.Error:
        raise ValueError(f"{config.key} is not the key of the certificate in {config.cert}") from None
    context.set_alpn_select_callback(_no_application_protocol)
    return options


def _no_application_protocol(connection: SSL.Connection, offered: list[bytes]) -> SSL._NoOverlappingProtocols:
    return SSL.NO_OVERLAPPING_PROTOCOLS


@implementer(IOpenSSLServerConnectionCreator)
class ReloadableTls:
    """The TLS side of every TLS listener (see the module docstring)."""

    def __init__(self, config: TlsConfig):
        self.config = config
        self.options = load(config)

    def serverConnectionForTLS(self, protocol: Any) -> SSL.Connection:  # noqa: N802 - Twisted's interface
        return SSL.Connection(self.options.getContext(), None)

    def reload(self) -> str | None:
        """Read the files again: None when the new certificate is in use, else why the old one stays."""
        try:
            self.options = load(self.config)
        except (OSError, ValueError) as e:
            return str(e)
        return None

    def wrap(self, factory: Any) -> TLSMemoryBIOFactory:
        """``factory``'s protocols behind TLS."""
        wrapped = TLSMemoryBIOFactory(self, False, factory)
        wrapped.noisy = False
        return wrapped

