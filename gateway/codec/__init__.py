"""The codec toolkit and plugin API: what a codec gives the gateway, and what it gets back.

A codec is sans-IO. For every accepted connection the adapter creates one
``Connection`` with ``CodecPlugin.new_connection(settings)`` and then:

* writes ``connection.connection_made()`` (a greeting; ``b""`` for none);
* feeds received bytes to ``receive_data`` (``b""`` means end of stream);
* takes events from ``next_event()`` until it returns ``None`` (more bytes
  needed). Events are ``Request`` (commands to execute), ``Reply`` (bytes to
  send with no command, e.g. a parse error), ``Subscribe`` (a server push
  stream) and ``Close``;
* for each ``Request`` executes its commands concurrently and writes
  ``connection.respond(request, results)``, where ``results`` are in the
  order of ``request.commands``. Answers are written in request order,
  whatever order the commands complete in.

The adapter takes events again after each call into the codec
(``connection_made``, ``receive_data``, ``respond``, ``push`` and ``timer``),
so any of them may leave events for ``next_event`` to return. Two events ask
for no answer and take no place in the answer order: ``Timer`` (call
``connection.timer(context)`` later: keep-alive deadlines, retries) and
``Unsubscribe`` (stop push streams a client no longer wants).

Every built-in codec, and the MQTT plugin, subclasses ``CodecConnection``
(below), which implements this API once over a framer from
``gateway.codec.framing``: a codec then only turns each whole frame into one
``Handled`` (an answer now, or commands plus a render function).

A codec never blocks and never raises on bad input: it answers with its
protocol's own error (``Reply``) or asks to close (``Close``). An exception
escaping a codec is a bug; the adapter logs it and closes that connection.

Each codec also names the storage format of the batches it produces
(``batch_format``), so that records it wrote can be stored as they arrived and
read back by any other codec through ``Record``.

This package is that API's face; its parts are ``connection`` (events, the ``Connection``
Protocols, ``CodecConnection``), ``formats`` (``BatchFormat`` and its capabilities),
``plugin`` (``CodecPlugin``, options), and the toolkit a codec builds on: ``framing``,
``varint``, ``text``, ``compression``, ``authlimits``, ``topic_configs`` (topic settings under
Kafka's names), ``consumer_protocol`` (Kafka's group member bytes, for a codec whose members
join groups as Kafka clients do), ``websocket`` (any codec over WebSocket, on a listener of its
own) and ``testing`` (the conformance mixin).
"""

from gateway.codec.authlimits import LoginLimits, basic_login
from gateway.codec.connection import (
    LOGIN_REFUSED,
    LOGIN_TURN,
    RUN_MAX,
    Acknowledgement,
    Answer,
    Close,
    CodecConnection,
    Connection,
    Credentials,
    Event,
    Framer,
    Handled,
    ListenerSettings,
    Pieces,
    PushConnection,
    Render,
    Reply,
    Request,
    Run,
    RunFor,
    Subscribe,
    Timer,
    TimerConnection,
    Tokens,
    Unsubscribe,
    answer_size,
    joined,
    merged_produce,
)
from gateway.codec.formats import (
    KAFKA_V2_RECORDS,
    ONE_RECORD,
    TANK_BUNDLE,
    BatchFormat,
    BatchProducer,
    ColumnarFormat,
    Columns,
    CompressingFormat,
    EncodedRecords,
    LeaderEpochFormat,
    RecordLayoutFormat,
    TransactionalFormat,
    Validated,
)
from gateway.codec.plugin import (
    CodecPlugin,
    Option,
    OptionError,
    choice,
    integer,
    parse_options,
)

__all__ = [
    "Acknowledgement",
    "Answer",
    "BatchFormat",
    "BatchProducer",
    "Close",
    "CodecConnection",
    "CodecPlugin",
    "ColumnarFormat",
    "Columns",
    "CompressingFormat",
    "Connection",
    "Credentials",
    "EncodedRecords",
    "Event",
    "Framer",
    "Handled",
    "KAFKA_V2_RECORDS",
    "LOGIN_REFUSED",
    "LOGIN_TURN",
    "LeaderEpochFormat",
    "LoginLimits",
    "ListenerSettings",
    "ONE_RECORD",
    "Option",
    "OptionError",
    "Pieces",
    "PushConnection",
    "RecordLayoutFormat",
    "Render",
    "RUN_MAX",
    "Reply",
    "Request",
    "Run",
    "RunFor",
    "Subscribe",
    "TANK_BUNDLE",
    "Timer",
    "TimerConnection",
    "Tokens",
    "TransactionalFormat",
    "Unsubscribe",
    "Validated",
    "answer_size",
    "basic_login",
    "choice",
    "integer",
    "joined",
    "merged_produce",
    "parse_options",
]
