"""MQTT 3.1.1 and 5 for polygate, as a third-party codec plugin.

Installed with ``pip install ./plugins/polygate-mqtt``, it registers
``mqtt = polygate_mqtt:plugin`` in the ``gateway.codecs`` entry-point group;
``gateway serve --protocols v1,mqtt`` then serves it on port 1883. A second entry point,
``mqtt-ws = polygate_mqtt:websocket_plugin``, serves the same codec over WebSocket
(subprotocol ``mqtt``, for browsers) on port 8083, as EMQX does (``gateway.codec.websocket``;
``--tls mqtt-ws`` for ``wss://``). It uses
only the public plugin API (``gateway.codec``, ``gateway.model``,
``gateway.codec.framing``) and no Twisted, like every codec.
"""

from gateway.codec import CodecPlugin
from gateway.codec.websocket import over_websocket

from .clients import Clients
from .codec import OPTIONS, MqttConnection
from .format import FORMAT

DEFAULT_PORT = 1883
WEBSOCKET_PORT = 8083  # EMQX's (Mosquitto has no default WebSocket listener)
MAX_FRAME = 1 << 20  # remaining length of one packet; --max-frame mqtt=BYTES

plugin = CodecPlugin(
    name="mqtt",
    default_port=DEFAULT_PORT,
    new_connection=MqttConnection,
    max_frame_size=MAX_FRAME,
    description="MQTT 3.1.1 and 5 (+ and # at any level, a chosen topic mapping) - third-party plugin",
    versions="3.1.1, 5",
    batch_format=FORMAT,
    options=OPTIONS,
    background=Clients,
)

websocket_plugin = over_websocket(plugin, name="mqtt-ws", default_port=WEBSOCKET_PORT, subprotocol="mqtt",
                                  description="MQTT over WebSocket (subprotocol mqtt), for browsers "
                                              "- third-party plugin")
