"""An MQTT 5 application message's properties <-> a record's headers, both ways.

What a Kafka consumer (or any protocol with headers) sees of an MQTT 5 PUBLISH, and what an
MQTT 5 subscriber gets of a record another protocol wrote:

* each User Property is a header of the same name and value (UTF-8), in order, repeats kept;
* Content Type, Payload Format Indicator, Response Topic and Correlation Data are the headers
  ``HEADER_NAMES`` names (``mqtt.content_type``...); the indicator's value is ``b"0"`` or
  ``b"1"``, the others' their bytes;
* Message Expiry Interval is the header ``mqtt.message_expiry``, the absolute time the message
  expires, in milliseconds since the epoch (decimal ASCII), so that every reader can tell;
  a subscriber gets what is left of the interval, and nothing once it passed (3.3.2.3.3).

Back to an MQTT 5 subscriber, every other header is a User Property: a value that is not
UTF-8 is given with replacement characters (a User Property is a UTF-8 string), a null one as
an empty string. The headers ``polygate.mqtt_qos`` (``format.QOS_HEADER``), ``polygate.mqtt_origin``
and ``polygate.mqtt_retain`` (``OWN``) are the gateway's own and never properties. An MQTT 3.1.1 subscriber gets the payload only.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import format as fmt
from . import properties as props
from .properties import Property

CONTENT_TYPE = "mqtt.content_type"
PAYLOAD_FORMAT = "mqtt.payload_format"
RESPONSE_TOPIC = "mqtt.response_topic"
CORRELATION_DATA = "mqtt.correlation_data"
MESSAGE_EXPIRY = "mqtt.message_expiry"
# The gateway's own headers, never User Properties: the publisher's client identifier, set while
# it has a No Local subscription (3.8.3.1), and the RETAIN flag a message was published with
# (for Retain As Published).
ORIGIN = "polygate.mqtt_origin"
RETAINED = "polygate.mqtt_retain"
OWN = frozenset({ORIGIN, RETAINED, fmt.QOS_HEADER})
HEADER_NAMES = {Property.CONTENT_TYPE: CONTENT_TYPE, Property.PAYLOAD_FORMAT_INDICATOR: PAYLOAD_FORMAT,
                Property.RESPONSE_TOPIC: RESPONSE_TOPIC, Property.CORRELATION_DATA: CORRELATION_DATA}
_PROPERTIES = {name: prop for prop, name in HEADER_NAMES.items()}


def headers_of(properties: props.Properties, now_ms: int = 0) -> bytes:
    """The encoded headers section (``format.encode_headers``) of a PUBLISH's (or a will's)
    ``properties``, received at ``now_ms``; empty without any."""
    headers: list[tuple[str, bytes | None]] = []
    for prop, name in HEADER_NAMES.items():
        value = properties.get(prop)
        if value is None:
            continue
        if isinstance(value, int):
            headers.append((name, str(value).encode()))
        else:
            headers.append((name, value if isinstance(value, bytes) else value.encode("utf-8")))
    expiry = properties.get(Property.MESSAGE_EXPIRY_INTERVAL)
    if expiry is not None:
        headers.append((MESSAGE_EXPIRY, str(now_ms + expiry * 1000).encode()))
    headers += ((name, value.encode("utf-8")) for name, value in properties.get(Property.USER_PROPERTY, ()))
    return fmt.encode_headers(headers) if headers else b""


def properties_of(headers: Sequence[tuple[str, bytes | None]], now_ms: int,
                  identifiers: Sequence[int] = ()) -> bytes | None:
    """The property list (without its length) a PUBLISH to an MQTT 5 subscriber carries for a
    record with ``headers``, at ``now_ms``, for the subscriptions of ``identifiers``; None if
    the message expired."""
    out: list[tuple[Property, object]] = [(Property.SUBSCRIPTION_IDENTIFIER, i) for i in identifiers]
    for name, value in headers:
        prop = _PROPERTIES.get(name)
        if prop is not None and value is not None:
            if prop is Property.PAYLOAD_FORMAT_INDICATOR:
                if value in (b"0", b"1"):
                    out.append((prop, int(value)))
            elif prop is Property.CORRELATION_DATA:
                out.append((prop, value))
            else:
                out.append((prop, value.decode("utf-8", "replace")))
        elif name == MESSAGE_EXPIRY:
            try:
                left_ms = int(value or b"") - now_ms
            except ValueError:
                continue  # not ours: no expiry
            if left_ms <= 0:
                return None
            out.append((Property.MESSAGE_EXPIRY_INTERVAL, min(-(-left_ms // 1000), 0xFFFFFFFF)))
        elif name not in OWN:
            out.append((Property.USER_PROPERTY, (name, (value or b"").decode("utf-8", "replace"))))
    return props.encode_body(out)
