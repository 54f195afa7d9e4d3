"""A run's cancel or compensate request as a typed record (``runtime.control.Control``): the JSON
the ledger keeps in ``runs.control`` is the same as before it was typed."""

from __future__ import annotations

import json

import pytest

from effectflow.ledger.records import ControlKind
from effectflow.runtime.control import Control


@pytest.mark.parametrize(
    "stored",
    [
        {"kind": "cancel", "reason": None, "by": "operator", "at": 1700000000.25},
        {"kind": "cancel", "reason": "customer asked", "by": "ana", "at": 5},
        {"kind": "compensate", "reason": "order voided", "by": "workflow", "at": 12.5},
    ],
)
def test_a_stored_request_reads_back_as_the_same_json(stored: dict[str, object]) -> None:
    """Read and written again, a request is the very JSON that was stored: the same keys, in the
    same order, the same values (an integer time stays an integer)."""
    control = Control.of(stored)
    assert control is not None
    assert control.kind is ControlKind(stored["kind"])
    assert json.dumps(control.to_json()) == json.dumps(stored)


def test_no_request_is_none_and_a_request_without_a_kind_is_a_cancel() -> None:
    """A run without a request has none; one recorded without a kind reads as a cancel (as the
    runtime always read it)."""
    assert Control.of(None) is None
    assert Control.of({"by": "ana", "at": 1.0}) == Control(ControlKind.CANCEL, None, "ana", 1.0)


def test_the_kind_is_stored_as_its_text() -> None:
    """The kind is written as the plain text the ledger always held."""
    written = Control(ControlKind.COMPENSATE, "goal gone", "workflow", 3.0).to_json()
    assert type(written["kind"]) is str
    assert written == {"kind": "compensate", "reason": "goal gone", "by": "workflow", "at": 3.0}
