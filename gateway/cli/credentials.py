"""The options by which a command-line client proves who it is to a gateway, shared by the client
commands (``gateway topics|produce|consume|groups|status``) and the admin ones (``gateway users|acls``).

* ``--tls-ca FILE``: speak TLS and trust the gateway's certificate from this CA file;
* ``--tls-cert FILE`` / ``--tls-key FILE``: a client certificate (mTLS; also turns TLS on, trusting
  the system's CAs unless ``--tls-ca`` is given);
* ``--user NAME`` / ``--mechanism``: log in as NAME (Kafka SASL, Cursus AUTH). The password is never
  taken from the command line, where every local user could read it: it comes from
  ``$POLYGATE_PASSWORD`` or a prompt.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

import click

SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")


def credential_options(fn: Any) -> Any:
    """Add ``--user``, ``--mechanism``, ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` to a command."""
    for option in reversed((
        click.option("--user", "-u", default=None, help="Log in as this user (Kafka SASL, Cursus AUTH); the "
                     "password comes from $POLYGATE_PASSWORD, else a prompt."),
        click.option("--mechanism", default="SCRAM-SHA-256", show_default=True, type=click.Choice(SASL_MECHANISMS),
                     help="Kafka SASL mechanism for --user."),
        click.option("--tls-ca", default=None, metavar="FILE", help="Speak TLS; trust the gateway's certificate "
                     "from this CA file."),
        click.option("--tls-cert", default=None, metavar="FILE", help="Speak TLS with this client certificate (mTLS)."),
        click.option("--tls-key", default=None, metavar="FILE", help="The client certificate's private key "
                     "(default: in the --tls-cert file)."),
    )):
        fn = option(fn)
    return fn


def caller_password(user: str) -> str:
    """The password of ``user``: ``$POLYGATE_PASSWORD``, else asked on the terminal (not echoed)."""
    password = os.environ.get("POLYGATE_PASSWORD")
    if password is None:
        password = click.prompt(f"password of {user}", hide_input=True, err=True)
    return password


def tls_context(tls_ca: str | None, tls_cert: str | None, tls_key: str | None) -> ssl.SSLContext | None:
    """The TLS context those options ask for (None: plain TCP). Raises ``click.ClickException`` (one
    line) for a file that cannot be read."""
    if not (tls_ca or tls_cert):
        if tls_key:
            raise click.ClickException("--tls-key needs --tls-cert")
        return None
    try:
        context = ssl.create_default_context(cafile=tls_ca)
        if tls_cert:
            context.load_cert_chain(tls_cert, tls_key)
    except (ssl.SSLError, OSError) as e:
        given = ", ".join(f"--{name} {path}" for name, path in
                          (("tls-ca", tls_ca), ("tls-cert", tls_cert), ("tls-key", tls_key)) if path)
        reason = e.reason if isinstance(e, ssl.SSLError) else e.strerror
        raise click.ClickException(f"cannot load the TLS files ({given}): {reason or e}") from None
    return context
