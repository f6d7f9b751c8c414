"""HTTP for polygate, as a second third-party codec plugin: a Kafka REST Proxy-compatible API.

Installed with ``pip install ./plugins/polygate-http``, it registers
``http = polygate_http:plugin`` in the ``gateway.codecs`` entry-point group;
``gateway serve --protocols kafka,http`` then serves it on port 8082 (REST Proxy's). It is
sans-IO like every codec: h11 parses the requests, the routes (``handlers``) turn them into
the shared command model, and the gateway's one adapter drives it; it uses only the public
plugin API (``gateway.codec``, ``gateway.model``) and no Twisted.
"""

from gateway.codec import CodecPlugin

from .codec import OPTIONS, HttpConnection
from .format import FORMAT

DEFAULT_PORT = 8082
MAX_BODY = 8 << 20  # the largest request body; --max-frame http=BYTES

plugin = CodecPlugin(
    name="http",
    default_port=DEFAULT_PORT,
    new_connection=HttpConnection,
    max_frame_size=MAX_BODY,
    description="HTTP/1.1: Kafka REST Proxy v2 and v3 - third-party plugin",
    versions="REST Proxy v2, v3",
    batch_format=FORMAT,
    options=OPTIONS,
)
