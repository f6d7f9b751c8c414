"""The splitting of a streamed body of concatenated JSON objects, piece by piece."""

from __future__ import annotations

import json

from polygate_http.jsonstream import JsonObjects, Malformed, TooLarge


def split(pieces: list[bytes], limit: int = 1000) -> list[object]:
    objects = JsonObjects(limit)
    out: list[object] = []
    for piece in pieces:
        out += objects.feed(piece)
    return out + objects.end()


def test_objects_are_split_at_their_braces_whatever_the_pieces():
    body = b' {"a": "}{\\"", "b": {"c": [1, {"d": "\\\\"}]}}\n{"e": 2}\r\n'
    expected = [b'{"a": "}{\\"", "b": {"c": [1, {"d": "\\\\"}]}}', b'{"e": 2}']
    assert split([body]) == expected
    for cut in range(1, len(body)):  # every place a piece may end, escapes included
        assert split([body[:cut], body[cut:]]) == expected, cut
    assert split([body[i:i + 1] for i in range(len(body))]) == expected
    assert [json.loads(o) for o in expected] == [{"a": '}{"', "b": {"c": [1, {"d": "\\"}]}}, {"e": 2}]


def test_an_object_over_the_limit_is_reported_once_and_the_next_is_read():
    large = b'{"v": "' + b"x" * 50 + b'"}'
    assert split([large + b'{"n": 1}'], limit=20) == [TooLarge(20), b'{"n": 1}']
    # cut in pieces: reported when it goes past the limit, its rest dropped as it comes
    assert split([large[:15], large[15:30], large[30:] + b'{"n": 1}'], limit=20) == [TooLarge(20), b'{"n": 1}']


def test_what_is_not_a_run_of_objects_ends_the_stream():
    assert split([b'{"n": 1} [1] {"n": 2}']) == [b'{"n": 1}', Malformed("Each record must be a JSON object")]
    assert split([b'{"n": 1} {"n": ']) == [b'{"n": 1}', Malformed("The body ends inside a record")]
    objects = JsonObjects(1000)
    assert objects.feed(b'{"n": ') == [] and objects.partial
    assert objects.feed(b'1}') == [b'{"n": 1}'] and not objects.partial
