"""A tool's redaction rule (docs/arguments.md#redaction): declared in Python or YAML, checked
against the tool's parameters, applied to a copy of the canonical arguments, capped."""

from __future__ import annotations

from typing import Any

import pytest

import effectflow as ef
from effectflow import digests
from effectflow.contracts import redaction

YAML = """\
side_effect_contract:
  tool: y_charge@1
  effect_class: external_write
  idempotency: {supported: true}
  redact:
    drop: [token]
    mask: [card.number]
"""


def _charge(amount: int, card: dict[str, Any], token: str, *, idempotency_key: str) -> None:
    raise AssertionError("never called here")


def test_drop_removes_and_mask_marks_nested_and_in_lists() -> None:
    """Dropped fields are gone, masked ones read "[masked]", in nested mappings and in each
    element of a list, and a value where the path needed a mapping is masked; the arguments
    given are not changed."""
    rule = ef.Redact(drop=["token", "items.secret"], mask=["card.number"])
    given = {
        "amount": 5,
        "token": "tok-1",
        "card": {"number": "4242", "exp": "12/30"},
        "items": [{"secret": "s", "n": 1}, "plain"],
    }
    shown = redaction.apply(given, rule)
    assert shown == {
        "amount": 5,
        "card": {"number": "[masked]", "exp": "12/30"},
        # Where the path expected a mapping, the value it could not look into may be the
        # secret itself: masked whole (the rule fails closed).
        "items": [{"n": 1}, "[masked]"],
    }
    assert given["token"] == "tok-1"
    assert given["card"]["number"] == "4242"
    assert redaction.apply({"amount": 1}, rule) == {"amount": 1}  # absent fields: nothing to do


def test_a_mapping_is_the_same_rule() -> None:
    """``redact={"drop": [...], "mask": [...]}`` declares the same rule as ``ef.Redact``."""
    made = ef.tool("u_map", effect="external_write", redact={"drop": ["token"]}, register=False)(
        lambda amount, token: None
    )
    assert made.contract.redact == ef.Redact(drop=("token",))


@pytest.mark.parametrize(
    ("redact", "says"),
    [
        (
            ef.Redact(drop=["tokn"]),
            "redact path 'tokn' names no parameter of the tool (its "
            "parameters: amount, card, token, idempotency_key)",
        ),
        ({"mask": ["cardd.number"]}, "redact path 'cardd.number' names no parameter"),
        ({"drop": "token"}, "must be a list of field paths"),
        ({"drop": ["card..x"]}, "is not a parameter name or a dotted path"),
        ({"drop": ["token"], "mask": ["token"]}, "in both drop and mask"),
        ({"hide": ["token"]}, "unknown key 'hide'"),
        (["token"], "not list"),
    ],
)
def test_a_bad_rule_is_refused_at_declaration(redact: Any, says: str) -> None:
    """A rule that names no parameter, is not a list of paths, or is contradictory is a
    ContractError when the tool is declared, saying which path and why."""
    with pytest.raises(ef.ContractError, match=None) as caught:
        ef.tool(
            "u_bad",
            effect="external_write",
            idempotency=ef.Idempotency(supported=True),
            redact=redact,
            register=False,
        )(_charge)
    assert says in caught.value.message
    assert "u_bad" in caught.value.message


def test_a_function_taking_kwargs_accepts_any_path() -> None:
    """``**kwargs`` can carry any name: the rule is not refused."""
    made = ef.tool("u_kw", redact=ef.Redact(drop=["anything.deep"]), register=False)(
        lambda **kw: None
    )
    assert made.contract.redact is not None


def test_a_yaml_rule_loads_and_its_bad_path_is_refused_with_its_line() -> None:
    """The YAML rule is the Python one; decorating a function that has no such parameter names
    the file and line of the rule, the path and the parameters."""
    contracts = ef.parse_contracts(YAML, filename="c.yaml")
    assert contracts.contract("y_charge@1").redact == ef.Redact(
        drop=("token",), mask=("card.number",)
    )
    made = contracts.tool("y_charge@1", register=False)(_charge)
    assert made.contract.redact is not None

    def missing(amount: int, card: dict[str, Any], *, idempotency_key: str) -> None: ...

    with pytest.raises(ef.ContractError) as caught:
        contracts.tool("y_charge@1", register=False)(missing)
    assert caught.value.message.startswith("c.yaml:5: side_effect_contract.redact: ")
    assert "'token' names no parameter" in caught.value.message


@pytest.mark.parametrize(
    ("body", "line", "says"),
    [
        ("  redact:\n    drop: token\n", 5, "expected a list"),
        ("  redact:\n    drop: [token]\n    keep: [x]\n", 6, "unknown field"),
        ("  redact:\n    drop: [token]\n    mask: [token]\n", 4, "in both drop and mask"),
        ("  redact:\n    drop: [card..x]\n", 5, "does not match"),
        ("  redact: [token]\n", 4, "expected"),
    ],
)
def test_bad_yaml_rules_are_refused_with_where_and_why(body: str, line: int, says: str) -> None:
    """A non-list, an unknown key, a contradiction or a malformed path: the file is refused,
    each problem with its line and field; nothing is loaded."""
    text = "side_effect_contract:\n  tool: y_bad@1\n  effect_class: external_write\n" + body
    with pytest.raises(ef.ContractFileError) as caught:
        ef.parse_contracts(text, filename="c.yaml")
    [problem] = caught.value.problems
    assert problem.line == line
    assert problem.field.startswith("side_effect_contract.redact")
    assert says in problem.message


def test_over_the_cap_a_marker_is_recorded_not_the_text() -> None:
    """Arguments over 8 KiB of canonical JSON (after redaction) record the marker with their
    size and the request digest; at the cap, the arguments themselves."""
    big = {"body": "x" * redaction.CAP_BYTES}
    size = len(digests.canonical_json(big).encode("utf-8"))
    assert redaction.recorded(big, None, "sha256:d") == {
        redaction.OVER_CAP: {
            "bytes": size,
            "cap": redaction.CAP_BYTES,
            "request_digest": "sha256:d",
        }
    }
    fits = {"body": "x" * (redaction.CAP_BYTES - len('{"body":""}'))}
    assert redaction.recorded(fits, None, "sha256:d") == fits
    # measured after redaction: a dropped large field does not push the rest over
    assert redaction.recorded(big, ef.Redact(drop=["body"]), "sha256:d") == {}
