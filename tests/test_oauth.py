"""Kafka SASL OAUTHBEARER: JWTs from the configured issuer, signed by a key of the JWKS file
(``--oauth-issuer``, ``--oauth-jwks``), with confluent-kafka's token callback."""

from __future__ import annotations

import json
import time

import jwt
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from cryptography.hazmat.primitives.asymmetric import rsa
from kafka_support import bootstrap, create_topics, unique, wait_until

ISSUER = "https://issuer.example"


@pytest.fixture
def keys(tmp_path):
    """The issuer's signing key (in the JWKS file the gateway reads) and another key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    return key, other, str(jwks)


def token(key, subject: str = "svc-reporting", issuer: str = ISSUER, expires_in: float = 600, kid: str = "k1") -> str:
    now = int(time.time())
    return jwt.encode({"sub": subject, "iss": issuer, "iat": now, "exp": now + int(expires_in)}, key,
                      algorithm="RS256", headers={"kid": kid})


def oauth_client(gw, token_text: str) -> dict:
    return {"bootstrap.servers": bootstrap(gw), "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", "oauth_cb": lambda _config: (token_text, time.time() + 600)}


def produce(conf: dict, topic: str, values: list[bytes]) -> list:
    """The delivery error (or None) of each of ``values``. A refusal the producer already knows of
    from the broker's metadata is raised by ``produce`` itself, at once: it counts as that error."""
    outcomes = []
    p = Producer({**conf, "message.timeout.ms": 8000})
    for v in values:
        try:
            p.produce(topic, v, partition=0, on_delivery=lambda e, _m: outcomes.append(e))
        except KafkaException as e:
            outcomes.append(e.args[0])
    p.flush(15)
    return outcomes


def test_a_token_from_the_issuer_authenticates_its_subject(gateway_factory, keys):
    key, _, jwks = keys
    gw = gateway_factory(("kafka",), ("--default-partitions", "1", "--require-auth", "kafka",
                                      "--oauth-issuer", ISSUER, "--oauth-jwks", jwks,
                                      "--authorizer", "acl", "--super-users", "User:svc-reporting"))
    topic = unique("oauth")
    conf = oauth_client(gw, token(key))
    create_topics(bootstrap(gw), topic, conf=conf)
    assert produce(conf, topic, [b"a", b"b"]) == [None, None]
    c = Consumer({**conf, "group.id": unique("g"), "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    seen = []
    try:
        wait_until(lambda: seen.extend(m.value() for m in c.consume(10, 0.5) if not m.error()) or len(seen) >= 2)
    finally:
        c.close()
    assert seen == [b"a", b"b"]
    # another subject is a principal of its own: with no ACL it may not write
    refused = produce(oauth_client(gw, token(key, subject="svc-other")), topic, [b"c"])
    assert refused[0] is not None and refused[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


@pytest.mark.parametrize("case", ["expired", "other issuer", "other key", "unknown kid", "not a jwt"])
def test_a_token_that_does_not_verify_is_refused(gateway_factory, keys, case):
    key, other, jwks = keys
    gw = gateway_factory(("kafka",), ("--require-auth", "kafka", "--oauth-issuer", ISSUER, "--oauth-jwks", jwks))
    bad = {"expired": lambda: token(key, expires_in=-3600),
           "other issuer": lambda: token(key, issuer="https://evil.example"),
           "other key": lambda: token(other),
           "unknown kid": lambda: token(key, kid="k2"),
           "not a jwt": lambda: "abc.def.ghi"}[case]()
    errors: list[KafkaError] = []
    p = Producer({**oauth_client(gw, bad), "error_cb": lambda e: errors.append(e)})
    p.produce(unique("oauth"), b"x")

    def refused() -> bool:
        p.poll(0.1)  # serves error_cb
        return any(e.code() == KafkaError._AUTHENTICATION for e in errors)

    wait_until(refused, 30, 0, "an authentication error")
    p.purge()


def test_serve_refuses_a_jwks_file_it_cannot_read(tmp_path):
    import subprocess

    from gateway.launcher import GATEWAY
    (tmp_path / "jwks.json").write_text("{not json")
    run = subprocess.run([GATEWAY, "serve", "--admin", "none", "--data-dir", str(tmp_path / "d"), "--protocols", "kafka",
                          "--oauth-issuer", ISSUER, "--oauth-jwks", str(tmp_path / "jwks.json")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--oauth-jwks" in run.stderr.strip().splitlines()[-1]
