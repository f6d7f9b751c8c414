"""How a persistent session is kept (``polygate_mqtt.session``): its record reads back as written,
a record someone else wrote is no session, and a session is read back from its anchor on as the
latest record of its client there."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from polygate_mqtt import format as fmt
from polygate_mqtt import session, topics

from gateway import model as m

FILTERS = st.dictionaries(st.sampled_from(["a/#", "+/b", "#", "$SYS/#", "/x", "a b/ü"]), st.integers(0, 2))
MARKS = st.dictionaries(st.tuples(st.sampled_from(["t", "u"]), st.integers(0, 3)),
                        st.builds(session.Mark, st.dictionaries(st.sampled_from(["a/#", "+/b"]), st.integers(0, 2**40)),
                                  st.dictionaries(st.integers(0, 2**40), st.integers(1, 65535), max_size=5)))


@given(FILTERS, st.lists(st.integers(1, 65535), max_size=5), st.integers(0, 2**50), MARKS)
def test_a_session_reads_back_as_written(filters, released, left_ms, marks):
    kept = session.Session(filters, tuple(released), left_ms, marks=marks)
    assert session.Session.decode(kept.encode()) == kept


def test_a_record_of_someone_else_is_no_session_and_positions_are_the_commits_with_their_marks():
    assert session.Session.decode(b"written by someone else") is None
    kept = session.Session({"a/#": 1}, marks={("t", 0): session.Mark({"a/#": 9}, {8: 3})})
    offsets = [(*session.ANCHOR, 5, ""), ("t", 0, 7, ""), ("t", 1, 3, "metadata is not read"), ("t", 2, -1, "")]
    assert session.anchor_of(offsets) == 5
    assert session.positions(kept, offsets) == {("t", 0): session.Position(7, {"a/#": 9}, {8: 3}),
                                                ("t", 1): session.Position(3)}
    assert session.anchor_of(offsets[1:]) == -1


def _read(base: int, records: list[tuple[bytes, bytes | None]], high_watermark: int) -> m.FetchResult:
    payload = b"".join(fmt.encode_record(i, 0, 0, key, value, b"") for i, (key, value) in enumerate(records))
    batch = m.StoredBatch(fmt.NAME, base, base + len(records) - 1, 0, payload)
    return m.FetchResult(topics.SESSIONS_TOPIC, 0, high_watermark, batches=(batch,))


def test_a_lookup_takes_the_latest_record_of_its_client_from_the_anchor_on_and_reads_on_to_the_end():
    lookup = session.Lookup(b"c", 11)
    assert lookup.fetch().offset == 11
    # the batch begins before the anchor: the record before it is not the session's
    assert lookup.take(_read(10, [(b"c", b"old"), (b"c", b"at anchor"), (b"d", b"other")], 20))
    assert (lookup.value, lookup.found, lookup.fetch().offset) == (b"at anchor", 11, 13)
    assert not lookup.take(_read(13, [(b"c", b"later"), (b"d", b"x")], 15))  # the end: done
    assert (lookup.value, lookup.found) == (b"later", 13)
    lookup = session.Lookup(b"c", 11)
    assert not lookup.take(_read(11, [(b"c", b"{}"), (b"c", None)], 13))  # a tombstone ends the session
    assert lookup.session is None
    assert not session.Lookup(b"c", 11).take(m.FetchResult(topics.SESSIONS_TOPIC, 0, error=m.Error(
        m.ErrorCode.OFFSET_OUT_OF_RANGE, "")))
