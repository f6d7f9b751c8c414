"""What the conversion tests share: one run converted through a source format's one-pass
``records_in`` or through its columns only, so that the two can be compared."""

from __future__ import annotations

import pytest

from gateway import model as m
from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.tank import format as tank_format
from gateway.convert import convert_run

FORMATS = {"tank": tank_format.FORMAT, "kafka": kafka_format.FORMAT}


def one_run(batches, target, direct):
    """``convert_run`` of ``batches`` (all of one source format) into one ``target`` batch (a name
    of ``FORMATS``), through the source's ``records_in`` (``direct``) or through its ``columns``
    only: the payload, or the fault it names."""
    source = FORMATS[batches[0].format]
    with pytest.MonkeyPatch.context() as patch:
        if not direct:
            patch.setattr(type(source), "records_in", lambda self, layout, batches, base_offset: None)
        try:
            return convert_run(batches, FORMATS[target], FORMATS).payload
        except m.CommandError as e:
            return str(e.error.message)
