"""How a persistent session is kept in committed offsets (``polygate_mqtt.session``): what is
written reads back the same, and a commit someone else wrote is no session."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from polygate_mqtt import session

FILTERS = st.dictionaries(st.sampled_from(["a/#", "+/b", "#", "$SYS/#", "/x", "a b/ü"]), st.integers(0, 2))


@given(FILTERS, st.lists(st.integers(1, 65535), max_size=5), st.integers(0, 2**50))
def test_an_anchor_reads_back_as_written(filters, released, left_ms):
    anchor = session.Anchor(filters, tuple(released), left_ms)
    assert session.Anchor.decode(anchor.encode()) == anchor


@given(st.integers(0, 2**40), st.dictionaries(st.sampled_from(["a/#", "+/b"]), st.integers(0, 2**40)),
       st.dictionaries(st.integers(0, 2**40), st.integers(1, 65535), max_size=5))
def test_a_position_reads_back_as_written(offset, since, inflight):
    position = session.Position(offset, since, inflight)
    assert session.Position.decode(offset, position.encode()) == position


def test_commits_of_other_writers_are_no_session_and_positions_without_metadata_are_plain():
    offsets = [(*session.ANCHOR, 0, "written by someone else"), ("t", 0, 7, ""), ("t", 1, 3, "{not json"),
               ("t", 2, -1, "")]
    anchor, positions = session.restored(offsets)
    assert anchor is None
    assert positions == {("t", 0): session.Position(7), ("t", 1): session.Position(3)}
    assert session.restored([(*session.ANCHOR, 0, session.Anchor({"a/#": 1}).encode())])[0] == \
        session.Anchor({"a/#": 1})
