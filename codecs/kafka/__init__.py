"""Apache Kafka wire protocol codec (docs/protocols/kafka.md)."""

from gateway.codec import CodecPlugin

from .codec import OPTIONS, KafkaConnection
from .format import FORMAT
from .handlers import HANDLERS

DEFAULT_PORT = 9092
MAX_FRAME = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes

plugin = CodecPlugin(
    name="kafka",
    default_port=DEFAULT_PORT,
    new_connection=KafkaConnection,
    max_frame_size=MAX_FRAME,
    description="Apache Kafka wire protocol (0.8 to 3.x clients)",
    versions=f"{len(HANDLERS)} APIs",
    batch_format=FORMAT,
    options=OPTIONS,
)
