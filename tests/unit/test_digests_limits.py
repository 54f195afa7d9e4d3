"""What ``to_jsonable`` refuses so both ledgers record the same (issue 14): NUL, lone surrogates,
integers past 64 bits, nesting past ``MAX_DEPTH`` — each refused with the path of the offending
part and what to do, never a raw ``RecursionError`` / ``UnicodeEncodeError`` / ``ValueError``;
and the edges just inside accepted unchanged. ``tests/conformance/test_inputs.py`` checks the same
rules through the public API on both backends."""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import math
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effectflow import digests, errors


def nested(levels: int, bottom: Any = 0) -> Any:
    value = bottom
    for _ in range(levels):
        value = [value]
    return value


def refusal(value: Any, path: str = "input") -> str:
    with pytest.raises(errors.ArgumentError) as caught:
        digests.to_jsonable(value, path=path)
    message = caught.value.message
    assert digests.recordable_text(message) == message, "the message must itself be recordable"
    return message


# -- text ----------------------------------------------------------------------------------------


def test_a_nul_is_refused_with_the_full_path_of_the_string() -> None:
    message = refusal({"items": [0, 1, 2, {"name": "ab\x00c"}]})
    assert message.startswith("input.items[3].name: the text contains a NUL character (\\x00)")
    assert "at index 2" in message
    assert "bytes" in message  # what to do


def test_a_nul_in_a_dict_key_names_the_dict_and_escapes_the_key() -> None:
    message = refusal({"meta": {"k\x00": 1}})
    assert message.startswith("input.meta: dict key 'k\\x00' contains a NUL character")


@pytest.mark.parametrize("text", ["\ud800", "caf\udce9", "x\udfff", "😀\ud83d"])
def test_a_lone_surrogate_is_refused_with_its_code_point(text: str) -> None:
    message = refusal({"note": text})
    assert message.startswith("input.note: the text contains a lone surrogate (U+D")


def test_a_lone_surrogate_in_a_key_never_reaches_the_message_raw() -> None:
    message = refusal({"\ud83d": {"x": 1}})
    assert message.startswith("input: dict key '\\ud83d' contains a lone surrogate")


def test_a_refused_value_under_an_odd_key_gets_an_escaped_segment() -> None:
    """Keys that would make the path ambiguous or unprintable are quoted (and escaped)."""
    assert refusal({"a.b": {"é\n": "\x00"}}).startswith("input['a.b']['\\xe9\\n']: the text")
    assert refusal({"ok": {"fine_key": math.nan}}).startswith("input.ok.fine_key: nan has no")


@pytest.mark.parametrize(
    "text",
    ["", "Zoë ✓ 漢字", "🧪😀\U0010fffd", "\x01\x1f\u2028\ufeff", "\\u0000 is text", "\\x00"],
)
def test_nul_free_unicode_is_kept_as_it_is(text: str) -> None:
    assert digests.to_jsonable({text: [text]}) == {text: [text]}
    assert json.loads(digests.dumps(text)) == text


def test_bytes_carry_nul_and_anything_else() -> None:
    assert digests.to_jsonable(b"\x00\xff") == {"$bytes": "AP8="}


# -- integers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2**63 - 1, -(2**63), 0, -1, 2**53 + 1])
def test_64_bit_integers_are_kept_exactly(n: int) -> None:
    assert digests.to_jsonable({"n": n}) == {"n": n}
    assert type(digests.to_jsonable(n)) is int


@pytest.mark.parametrize(
    ("n", "shown"),
    [
        (2**63, "a 64-bit integer"),
        (2**64, "a 65-bit integer"),
        (-(2**63) - 1, "a negative 64-bit integer"),
        (10**5000, "a 16610-bit integer"),  # printing it would raise ValueError (4300 digits)
    ],
    ids=["2**63", "2**64", "-(2**63)-1", "10**5000"],
)
def test_integers_past_64_bits_are_refused(n: int, shown: str) -> None:
    """Refused by its size, not quoted: the message is recorded and shown, and the number may be
    a field a redaction rule keeps out of the ledger (an account number)."""
    message = refusal({"n": n})
    assert message.startswith(f"input.n: {shown} is outside the 64-bit integer range")
    assert "string or a decimal.Decimal" in message
    if n.bit_length() < 4000:  # printable (Python refuses to print 10**5000)
        assert str(n)[:12] not in message


def test_an_int_subclass_is_held_to_the_same_range() -> None:
    class Big(int):
        pass

    assert digests.to_jsonable(Big(5)) == 5
    assert "outside the 64-bit" in refusal(Big(2**64))


def test_a_large_integral_float_stays_a_float() -> None:
    """Only integral floats below 2**53 print as integers; 1e20 is no int64 and stays a float."""
    assert digests.to_jsonable(1e20) == 1e20
    assert type(digests.to_jsonable(1e20)) is float


# -- depth ---------------------------------------------------------------------------------------


def test_64_levels_are_accepted_65_refused_at_the_65th() -> None:
    assert digests.MAX_DEPTH == 64
    assert digests.to_jsonable(nested(64)) == nested(64)
    message = refusal({"doc": nested(64)})  # the dict and 64 lists
    assert message.startswith("input.doc[0][0][0]...(57 more)...[0][0][0]: is nested deeper")
    assert "64 levels" in message


@pytest.mark.parametrize("levels", [65, 1_000, 100_000])
def test_any_depth_is_refused_without_recursing_into_it(levels: int) -> None:
    assert "nested deeper than 64" in refusal(nested(levels))
    if levels > digests.MAX_DEPTH + digests.ENVELOPE_DEPTH:  # a digest only allows envelopes more
        with pytest.raises(errors.ArgumentError):
            digests.digest(nested(levels))


def test_dicts_and_sets_count_as_levels_too() -> None:
    value: Any = 1
    for i in range(64):
        value = {f"k{i}": value} if i % 2 else [value]
    assert digests.to_jsonable(value) is not None
    assert "nested deeper" in refusal({"x": value})
    assert "nested deeper" in refusal(nested(64, frozenset({1})))


def test_a_value_that_contains_itself_is_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert "contains itself" in refusal({"loop": loop})
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    assert refusal(cycle).startswith("input.self.self.self...")


def test_a_deep_dataclass_is_refused_not_overflowed() -> None:
    @dataclasses.dataclass
    class Node:
        child: Any

    node: Any = None
    for _ in range(5_000):
        node = Node(node)
    assert "nested deeper" in refusal(node)


def test_a_digest_leaves_room_for_an_envelope_around_a_recorded_value() -> None:
    """A value accepted for recording can be digested inside the runtime's envelopes (a
    decision's parameters around its evidence), which only a hash of is recorded."""
    evidence = digests.to_jsonable({"doc": nested(63)})
    assert digests.digest({"effect_id": "e", "evidence": evidence}).startswith("sha256:")


# -- ids and raw text ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("", "must contain a non-space character"),
        (" \t\n", "must contain a non-space character"),
        ("r\x00", "NUL character"),
        ("r\ud800", "lone surrogate"),
        (7, "must be a string, not a int"),
    ],
)
def test_check_id_refuses_what_no_ledger_stores_the_same(value: Any, said: str) -> None:
    with pytest.raises(errors.ArgumentError) as caught:
        digests.check_id(value, path="run_id")
    assert caught.value.message.startswith("run_id: ")
    assert said in caught.value.message


@pytest.mark.parametrize("value", ["r1", "スレッド🧵", "a b", "x" * 300])
def test_check_id_returns_a_good_id_unchanged(value: str) -> None:
    assert digests.check_id(value, path="run_id") is value


def test_recordable_text_escapes_only_what_cannot_be_stored() -> None:
    kept = "Zoë ✓ 😀"
    assert digests.recordable_text(kept) is kept
    assert digests.recordable_text("a\x00b\ud800c é") == "a\\x00b\\ud800c é"


def test_a_digest_of_raw_text_with_a_surrogate_is_an_argument_error() -> None:
    with pytest.raises(errors.ArgumentError, match="lone surrogate"):
        digests.sha256_hex("scope\ud800")


# -- the same values as before, faster -----------------------------------------------------------


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Point(NamedTuple):
    x: int
    y: int


def test_subclasses_and_other_types_normalize_as_before() -> None:
    value = {
        Color.RED: Level.HIGH,
        "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
        "point": Point(1, 2),
        "tuple": (1.0, 2.5),
        "set": {3, 1, 2},
        "flag": True,
        "none": None,
    }
    assert digests.to_jsonable(value) == {
        "red": 3,
        "ordered": {"b": 1, "a": 2},
        "point": [1, 2],
        "tuple": [1, 2.5],
        "set": [1, 2, 3],
        "flag": True,
        "none": None,
    }
    assert type(digests.to_jsonable(Level.HIGH)) is int
    assert type(digests.to_jsonable(True)) is bool


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=digests.INT_MIN, max_value=digests.INT_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")),
            children,
            max_size=4,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_recordable_json_is_accepted_and_is_a_fixed_point(value: Any) -> None:
    """Any JSON inside the rules is accepted, survives printing and parsing, and normalizing it
    again changes nothing (the runtime normalizes recorded values more than once)."""
    normalized = digests.to_jsonable(value)
    assert json.loads(digests.canonical_json(normalized)) == normalized
    assert digests.to_jsonable(normalized) == normalized
    assert digests.dumps(normalized) == digests.dumps(value)
