"""OAUTHBEARER (RFC 7628, KIP-255/KIP-768) tokens: JWTs checked against a configured issuer and JWKS file.

A token is accepted when it is a JWT signed with an asymmetric algorithm
(RS*, PS*, ES*, EdDSA; never ``none`` or a shared secret) by a key of the
JWKS file (chosen by the token's ``kid``, or the only key), its ``iss`` is the
configured issuer, it has not expired (``exp``, with ``LEEWAY_S`` for clock
skew; ``nbf`` honoured), its ``aud`` includes the configured audience when one
is set, and it names a subject: ``sub`` (or ``--oauth-principal-claim``)
becomes the principal ``User:<subject>``. This is what Kafka's
``OAuthBearerValidatorCallbackHandler`` checks, with the keys read from a file
instead of fetched from a URL (the gateway makes no outbound calls).
"""

from __future__ import annotations

import jwt

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
LEEWAY_S = 30


class TokenError(ValueError):
    """A token that is not accepted; the message says why, never the token."""


class BearerTokens:
    """Verifies bearer tokens for the listeners (``ListenerSettings.tokens``)."""

    def __init__(self, issuer: str, jwks_path: str, audience: str | None = None, principal_claim: str = "sub"):
        self.issuer = issuer
        self.audience = audience
        self.principal_claim = principal_claim
        try:
            with open(jwks_path, encoding="utf-8") as f:
                self.keys = jwt.PyJWKSet.from_json(f.read())
        except (OSError, ValueError, jwt.PyJWTError) as e:
            raise ValueError(f"cannot read the JWKS file {jwks_path}: {e}") from None

    def verify(self, token: str) -> str:
        """The user ``token`` names; raises ``TokenError`` when it is not accepted."""
        try:
            header = jwt.get_unverified_header(token)
            kid = header.get("kid")
            keys = [k for k in self.keys.keys if kid is None or k.key_id == kid]
            if len(keys) != 1:
                raise TokenError("no key of the JWKS file matches the token" if not keys
                                 else "the token names no key id and the JWKS file has several keys")
            claims = jwt.decode(token, keys[0].key, algorithms=list(ALGORITHMS), issuer=self.issuer,
                                audience=self.audience, leeway=LEEWAY_S,
                                options={"require": ["exp", "iss"], "verify_aud": self.audience is not None})
        except jwt.PyJWTError as e:
            raise TokenError(f"invalid token: {e}") from None
        subject = claims.get(self.principal_claim)
        if not isinstance(subject, str) or not subject:
            raise TokenError(f"the token has no {self.principal_claim!r} claim")
        return subject
