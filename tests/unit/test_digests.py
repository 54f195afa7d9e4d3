"""Canonical JSON, digests and idempotency keys: stable where they must be, distinct where not."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import math

import pytest

from effectflow import digests, errors


def key(**overrides: str) -> str:
    parts = {
        "tenant": "acme",
        "operation_type": "send_email",
        "target": "",
        "payload_digest": digests.digest({"to": "alice@example.com", "subject": "Your case"}),
        "logical_operation_id": "op_case_92_email",
    }
    parts.update(overrides)
    return digests.idempotency_key(**parts)


# -- canonical JSON ---------------------------------------------------------------------------------


def test_key_order_does_not_change_the_digest() -> None:
    """Dicts built in another order (at any depth) print and digest the same."""
    first = {"b": 1, "a": {"y": [1, 2], "x": None}}
    second = {"a": {"x": None, "y": [1, 2]}, "b": 1}
    assert digests.dumps(first) == digests.dumps(second) == '{"a":{"x":null,"y":[1,2]},"b":1}'
    assert digests.digest(first) == digests.digest(second)


def test_integral_float_digests_like_int() -> None:
    """1.0 and 1 are the same number and digest the same; 1.5 does not."""
    assert digests.digest({"amount": 1.0}) == digests.digest({"amount": 1})
    assert digests.digest({"amount": 1.5}) != digests.digest({"amount": 1})


def test_aware_datetimes_in_other_offsets_digest_the_same() -> None:
    """One instant written in two UTC offsets normalizes to one UTC string."""
    utc = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
    paris = dt.datetime(2024, 5, 1, 14, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert digests.to_jsonable(paris) == "2024-05-01T12:00:00Z"
    assert digests.digest({"at": utc}) == digests.digest({"at": paris})
    assert digests.digest({"at": utc}) != digests.digest({"at": utc + dt.timedelta(seconds=1)})


def test_naive_datetime_is_refused() -> None:
    """A naive datetime is ambiguous, so it is refused with its path."""
    with pytest.raises(errors.ArgumentError, match=r"\$\.at: naive datetime"):
        digests.to_jsonable({"at": dt.datetime(2024, 5, 1, 12, 0)})


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, decimal.Decimal("NaN")])
def test_non_finite_numbers_are_refused(value: object) -> None:
    """NaN and infinities have no JSON form: refused, naming the path."""
    with pytest.raises(errors.ArgumentError, match=r"\$\.amount\[1\]: .* no JSON form"):
        digests.to_jsonable({"amount": [0, value]})


def test_sets_are_order_independent() -> None:
    """Sets become sorted lists, so their iteration order cannot change a digest."""
    assert digests.to_jsonable({3, 1, 2}) == [1, 2, 3]
    assert digests.digest(frozenset({"b", "a"})) == digests.digest({"a", "b"})


def test_bytes_are_tagged_base64() -> None:
    """Bytes are recorded as tagged base64, distinct from the same text as a str."""
    assert digests.to_jsonable(b"\x00hi") == {"$bytes": "AGhp"}
    assert digests.digest(b"hi") != digests.digest("hi")


def test_decimals_normalize() -> None:
    """Decimals are exact strings: 1.10 and 1.1 are equal, never rounded through a float."""
    assert digests.to_jsonable(decimal.Decimal("1.10")) == "1.1"
    assert digests.digest(decimal.Decimal("1.10")) == digests.digest(decimal.Decimal("1.1"))
    assert digests.to_jsonable(decimal.Decimal("0.1")) == "0.1"


def test_dataclasses_digest_like_their_fields() -> None:
    """A dataclass is recorded as the dict of its fields."""

    @dataclasses.dataclass
    class Refund:
        payment_id: str
        amount: int

    assert digests.to_jsonable(Refund("pay_1", 500)) == {"payment_id": "pay_1", "amount": 500}
    assert digests.digest(Refund("pay_1", 500)) == digests.digest(
        {"amount": 500, "payment_id": "pay_1"}
    )


def test_unserializable_value_names_its_path() -> None:
    """A value with no JSON form is refused with the exact path of the offending value."""
    with pytest.raises(errors.ArgumentError) as caught:
        digests.to_jsonable({"items": [1, 2, {"x": object()}]})
    assert caught.value.message.startswith("$.items[2].x: a object cannot be recorded")
    assert caught.value.code == "bad_argument"


def test_non_string_dict_keys_are_refused() -> None:
    """Dict keys must be strings, or two dicts could print the same."""
    with pytest.raises(errors.ArgumentError, match=r"\$\.counts: dict key 1 is a int"):
        digests.to_jsonable({"counts": {1: "one"}})


# -- idempotency keys -------------------------------------------------------------------------------


def test_key_is_stable() -> None:
    """The same logical operation yields the same key every time (a retry reuses it)."""
    assert key() == key()
    assert key().startswith(digests.KEY_PREFIX)


@pytest.mark.parametrize(
    "override",
    [
        {"tenant": "globex"},
        {"operation_type": "send_sms"},
        {"target": "case_93"},
        {"payload_digest": digests.digest({"to": "bob@example.com", "subject": "Your case"})},
        {"logical_operation_id": "op_case_92_email_followup"},
    ],
    ids=["tenant", "operation", "target", "payload", "logical_operation"],
)
def test_key_differs_per_component(override: dict[str, str]) -> None:
    """Changing any one component of the logical operation changes the key."""
    assert key(**override) != key()


def test_key_reveals_no_raw_parameters() -> None:
    """A key travels to providers and logs, so it contains none of the raw values it stands for."""
    made = key()
    for raw in ("alice", "example.com", "acme", "send_email", "op_case_92", "Your case"):
        assert raw not in made
    assert made[len(digests.KEY_PREFIX) :].isalnum()
