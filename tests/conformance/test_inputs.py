"""Both ledgers accept and refuse the same inputs (issue 14).

What one backend would refuse or alter — a NUL (PostgreSQL refuses it in text and jsonb, SQLite
stores it), a lone surrogate (no UTF-8 form), an integer past 64 bits (SQLite's JSON functions
read it as a float, jsonb keeps it exact), nesting past 64 levels (a ``RecursionError`` at 100k),
a blank run id (silently replaced by a random one) — is refused through the public API with
``ef.ArgumentError`` naming the path, before anything is recorded: every table of the ledger is
as it was. The edges just inside the rules are accepted and come back identically from both.

A case whose ``gap`` is set needs a check outside ``digests`` and ``Runtime._new_run`` (the module
named in it): until that lands it is an expected failure, and once it passes it fails, saying so,
until its ``gap`` is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlparse

import psycopg
import pytest

import effectflow as ef
from effectflow import digests

# -- the application ----------------------------------------------------------------------------


@ef.workflow("ci_echo")
def echo(ctx: ef.Context, **fields: Any) -> dict[str, Any]:
    """Returns its input: the output round-trips what the input did."""
    return fields


@ef.tool("ci_send", effect="external_write", effect_id="id", settles_within=0)
def send(text: Any, *, idempotency_key: str) -> dict[str, Any]:
    return {"id": "msg_1", "echo": text}


@ef.tool("ci_lost", effect="external_write", effect_id="id")
def lost(*, idempotency_key: str) -> dict[str, Any]:
    """Its answer is always lost and nothing can look it up: the effect waits for a person."""
    raise ef.OutcomeUnknown("the answer was lost")


@ef.workflow("ci_lost_case")
def lost_case(ctx: ef.Context) -> Any:
    return ctx.call("send", lost)


@ef.tool("ci_refund", effect="financial_write", idempotency=ef.Idempotency(supported=True))
def refund(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    return {"id": "rf_1", "amount": amount}


@ef.workflow("ci_refund_case")
def refund_case(ctx: ef.Context) -> Any:
    return ctx.call("refund", refund, amount=5)


#: What the tool of ``ci_call`` is called with, and under which step id (set by each test).
CALL: dict[str, Any] = {}
#: What ``ci_return``'s tool returns after committing (set by each test).
RETURNS: list[Any] = []


@ef.workflow("ci_call")
def call_flow(ctx: ef.Context) -> Any:
    return ctx.call(CALL["step"], send, text=CALL["text"])


@ef.tool("ci_returns", effect="external_write", effect_id="id", settles_within=0)
def returns(*, idempotency_key: str) -> Any:
    return RETURNS[0]


@ef.workflow("ci_return")
def return_flow(ctx: ef.Context) -> Any:
    return ctx.call("send", returns)


def nested(levels: int) -> Any:
    """A value ``levels`` lists deep (``[[...]]``), built without recursion."""
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


def self_containing() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


# -- the ledger, seen from below ----------------------------------------------------------------


def rows(url: str) -> dict[str, int]:
    """Row count of every table of the ledger, read around the store: "nothing recorded" means
    this did not change, whatever table a future version adds."""
    if url.startswith("sqlite:"):
        with sqlite3.connect(urlparse(url).path) as conn:
            names = [
                n
                for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                if not n.startswith("sqlite_")
            ]
            return {n: conn.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0] for n in names}
    with psycopg.connect(url) as pg:
        names = [
            n
            for (n,) in pg.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            )
        ]
        counted = {}
        for n in names:
            found = pg.execute(f'SELECT count(*) FROM "{n}"').fetchone()
            counted[n] = 0 if found is None else int(found[0])
        return counted


def is_postgres(url: str) -> bool:
    return url.startswith("postgres")


# -- what a case starts from --------------------------------------------------------------------


@dataclasses.dataclass
class Made:
    """What a setup left in the ledger for the case to act on."""

    run_id: str = ""
    step_id: str = ""
    effect_id: str = ""
    #: The ledger's URL (a case may open another runtime on it).
    url: str = ""


def nothing(rt: ef.Runtime) -> Made:
    return Made()


def in_doubt(rt: ef.Runtime) -> Made:
    """A run paused on an effect that may have happened: ``rt.resolve`` settles it."""
    run = rt.start(lost_case, run_id="lost")
    [effect] = rt.effects(run_id=run.run_id)
    assert run.status is ef.RunStatus.PAUSED
    return Made(run.run_id, "send", effect.effect_id)


def awaiting_approval(rt: ef.Runtime) -> Made:
    """A run paused before a refund that needs a person's approval."""
    run = rt.start(refund_case, run_id="refund")
    assert run.status is ef.RunStatus.PAUSED
    return Made(run.run_id, "refund")


@dataclasses.dataclass(frozen=True)
class Bad:
    """One input both ledgers must refuse through the public API, naming ``path``."""

    name: str
    act: Callable[[ef.Runtime, Made], Any]
    path: str
    setup: Callable[[ef.Runtime], Made] = nothing
    #: The check it still needs outside this module's reach, and where; None: it holds.
    gap: str | None = None


def resolve(evidence: dict[str, Any], **extra: Any) -> Callable[[ef.Runtime, Made], Any]:
    return lambda rt, made: rt.resolve(
        made.effect_id, committed=True, evidence=evidence, by="ops", **extra
    )


def guard(arguments: dict[str, Any], scope: str = "thread-1", call_id: str = "call-1") -> Any:
    return lambda rt, made: rt.guard(send, arguments, scope=scope, call_id=call_id)


def start(run_id: str | None = "r1", **fields: Any) -> Callable[[ef.Runtime, Made], Any]:
    return lambda rt, made: rt.start(echo, run_id=run_id, **fields)


def other_tenant(url: str, tenant: str) -> Any:
    with ef.Runtime(url, tenant=tenant) as rt:
        return rt.start(echo, run_id="t1", n=1)


BAD = [
    # ids
    Bad("run_id_nul", start("run\x001", n=1), "run_id"),
    Bad("run_id_lone_surrogate", start("run\udc801", n=1), "run_id"),
    Bad("run_id_empty", start("", n=1), "run_id"),
    Bad("run_id_whitespace", start(" \t\n", n=1), "run_id"),
    Bad("submit_run_id_empty", lambda rt, made: rt.submit(echo, run_id="", n=1), "run_id"),
    Bad(
        "start_async_run_id_whitespace",
        lambda rt, made: asyncio.run(rt.start_async(echo, run_id="  ", n=1)),
        "run_id",
    ),
    Bad("guard_scope_nul", guard({"text": "hi"}, scope="thread\x001"), "scope"),
    Bad("guard_scope_lone_surrogate", guard({"text": "hi"}, scope="t\ud800"), "scope"),
    Bad("guard_call_id_nul", guard({"text": "hi"}, call_id="call\x001"), "call_id"),
    Bad(
        "decision_id_nul",
        resolve({"note": "seen"}, decision_id="dec\x001"),
        "decision_id",
        setup=in_doubt,
    ),
    Bad(
        "approval_id_nul",
        lambda rt, made: rt.approve(made.run_id, made.step_id, approver="ops", approval_id="a\x00"),
        "approval_id",
        setup=awaiting_approval,
    ),
    Bad(
        "tenant_nul",
        lambda rt, made: other_tenant(made.url, "acme\x00"),
        "tenant",
    ),
    # run input
    Bad("input_value_nul", start(items=[0, 1, 2, {"name": "a\x00b"}]), "input.items[3].name"),
    Bad("input_dict_key_nul", start(meta={"ok": 1, "k\x00": 2}), "input.meta: dict key 'k\\x00'"),
    Bad("input_lone_surrogate", start(note="caf\udce9"), "input.note"),
    Bad("input_key_lone_surrogate", start(meta={"\ud83d": 1}), "input.meta: dict key"),
    Bad("input_int_2_64", start(n=2**64), "input.n: a 65-bit integer is outside"),
    Bad("input_int_below_int64", start(n=-(2**63) - 1), "input.n: a negative 64-bit integer"),
    Bad("input_int_10_5000", start(n=10**5000), "input.n: a 16610-bit integer"),
    Bad("input_nan", start(score=float("nan")), "input.score: nan has no JSON form"),
    Bad("input_infinity", start(score=[float("-inf")]), "input.score[0]: -inf has no JSON form"),
    # the input dict and 64 lists: 65 deep; refused at the 65th container
    Bad("input_65_deep", start(doc=nested(64)), "input.doc[0][0][0]...(57 more)...[0][0][0]: is"),
    Bad("input_100000_deep", start(doc=nested(100_000)), "input.doc[0][0][0]...(57 more)"),
    Bad("input_contains_itself", start(loop=self_containing()), "input.loop[0][0][0]"),
    # tool arguments (a guarded call checks them before any run exists)
    Bad("guard_argument_nul", guard({"text": "a\x00b"}), "ci_send.args.text"),
    Bad("guard_argument_lone_surrogate", guard({"text": "\udfff"}), "ci_send.args.text"),
    Bad("guard_argument_2_64", guard({"text": {"n": 2**64}}), "ci_send.args.text.n"),
    Bad("guard_argument_65_deep", guard({"text": nested(64)}), "ci_send.args.text[0]"),
    Bad("guard_argument_100000_deep", guard({"text": nested(100_000)}), "ci_send.args.text[0]"),
    # evidence given to rt.resolve
    Bad("evidence_nul", resolve({"note": "a\x00"}), "evidence.note", setup=in_doubt),
    Bad("evidence_key_nul", resolve({"a\x00": 1}), "evidence: dict key", setup=in_doubt),
    Bad("evidence_lone_surrogate", resolve({"note": "\ud800"}), "evidence.note", setup=in_doubt),
    Bad("evidence_2_64", resolve({"amount": 2**64}), "evidence.amount", setup=in_doubt),
    Bad("evidence_65_deep", resolve({"doc": nested(64)}), "evidence.doc[0]", setup=in_doubt),
    Bad("evidence_100000_deep", resolve({"doc": nested(10**5)}), "evidence.doc", setup=in_doubt),
]


@pytest.mark.parametrize("case", BAD, ids=[c.name for c in BAD])
def test_a_bad_input_is_refused_naming_its_path_and_nothing_is_recorded(
    any_ledger: str, case: Bad
) -> None:
    with ef.Runtime(any_ledger) as rt:
        made = dataclasses.replace(case.setup(rt), url=any_ledger)
        before, runs = rows(any_ledger), rt.runs()
        with known_gap(case.gap):
            with pytest.raises(ef.ArgumentError) as refused:
                case.act(rt, made)
            assert case.path in refused.value.message
            assert refused.value.code == "bad_argument"
            assert "\x00" not in refused.value.message  # the message itself is recordable
            assert digests.recordable_text(refused.value.message) == refused.value.message
            assert rows(any_ledger) == before
            assert rt.runs() == runs
            if case.setup is nothing:
                assert rt.runs() == []
                assert rt.effects() == []


@contextlib.contextmanager
def known_gap(gap: str | None) -> Iterator[None]:
    """An expected failure while ``gap`` is open (on every backend); a failure once it closed."""
    if gap is None:
        yield
        return
    try:
        yield
    except (Exception, pytest.fail.Exception):
        pytest.xfail(gap)
    pytest.fail(f"this passes now: drop its gap ({gap})")


# -- inside a workflow ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "text", "path", "gap"),
    [
        ("send", "a\x00b", "send.args.text", None),
        ("send", {"deep": nested(64)}, "send.args.text.deep[0]", None),
        ("send", 2**64, "send.args.text", None),
        (
            "send\x00",
            "hi",
            "step",
            None,
        ),
    ],
    ids=["argument_nul", "argument_65_deep", "argument_2_64", "step_id_nul"],
)
def test_a_bad_step_fails_the_run_before_its_intent_identically(
    any_ledger: str, step: str, text: Any, path: str, gap: str | None
) -> None:
    """A workflow's bad ``ctx.call`` is the run's recorded failure (the run exists already), with
    the path; nothing of the step is recorded and nothing is called."""
    CALL.update(step=step, text=text)
    with ef.Runtime(any_ledger) as rt, known_gap(gap):
        run = rt.start(call_flow, run_id="bad-step")
        assert run.status is ef.RunStatus.FAILED
        assert run.error is not None
        assert run.error["code"] in ("bad_argument", "contract_error")
        assert path in run.error["message"]
        assert rt.steps("bad-step") == []
        assert rt.attempts("bad-step") == []
        assert rt.effects() == []


# -- results: the effect happened, so the result is not refused but confirmed without it -------


@pytest.mark.parametrize(
    "raw",
    [
        "a\x00b",
        {"id": "p1", "body": "\ud800"},
        {"id": "p1", "n": 2**64},
        -(2**63) - 1,
        nested(65),
        {"id": "p1", "doc": nested(100_000)},
        self_containing(),
    ],
    ids=["nul", "lone_surrogate", "2_64", "below_int64", "65_deep", "100000_deep", "itself"],
)
def test_an_unrecordable_result_confirms_the_effect_identically(any_ledger: str, raw: Any) -> None:
    """A tool's result arrives after its effect: it is never refused (nor a raw exception), the
    effect is confirmed with what can be recorded and the workflow gets ``ResultNotRecordable``."""
    RETURNS[:] = [raw]
    with ef.Runtime(any_ledger) as rt:
        run = rt.start(return_flow, run_id="weird")
        assert run.status is ef.RunStatus.FAILED
        assert run.error is not None
        assert run.error["code"] == "result_not_recordable"
        [effect] = rt.effects(run_id="weird")
        assert effect.status is ef.StepStatus.CONFIRMED
        assert effect.evidence is not None
        assert effect.evidence["code"] == "result_not_recordable"
        assert "send.result" in effect.evidence["message"]
        if isinstance(raw, dict):
            assert effect.external_effect_id == "p1"
        assert rt.verify_audit("weird") == []


# -- the edges just inside the rules -------------------------------------------------------------

UNICODE = "Zoë Müller ✓ 漢字 ﷽ \u2028\ufeff\x01\x1f"
#: Six characters, not a NUL: recorded as the text it is.
ESCAPE = "C:\\u0000 and \\x00 are text"
EMOJI = "🧪😀 \U0010fffd"

GOOD: dict[str, dict[str, Any]] = {
    "int64_max": {"n": 2**63 - 1, "m": [2**63 - 1]},
    "int64_min": {"n": -(2**63)},
    # the input dict and 63 lists: exactly 64 deep
    "64_deep": {"doc": nested(63)},
    "non_bmp_emoji": {"note": EMOJI, "by_key": {EMOJI: EMOJI}},
    "nul_free_unicode": {"note": UNICODE, "by_key": {UNICODE: [UNICODE]}},
    "escape_sequences_as_text": {"note": ESCAPE, "by_key": {ESCAPE: ESCAPE}},
    "bytes_carry_nul": {"blob": b"\x00\xff"},
    # Floats whose shortest print has an exponent: jsonb printed them back as integers (another
    # value to JSON, and to the seals); PostgreSQL stores the canonical text since version 8.
    "floats_with_exponents": {"f": [1e16, 1.5e17, 1e300, -1e22, 1e-7, 5e-324, 0.1, 2.0]},
}


@pytest.mark.parametrize("fields", list(GOOD.values()), ids=list(GOOD))
def test_a_good_edge_is_accepted_and_round_trips_identically(
    any_ledger: str, fields: dict[str, Any]
) -> None:
    """Accepted, and read back (by another runtime, from the ledger) as exactly what was given,
    to the type of each number: the same on both backends."""
    expected = digests.to_jsonable(fields)
    with ef.Runtime(any_ledger) as rt:
        run = rt.start(echo, run_id="edge", **fields)
        assert run.status is ef.RunStatus.SUCCEEDED
    with ef.Runtime(any_ledger) as again:
        stored = again.run("edge")
        assert stored.input == expected
        assert stored.output == expected
        assert digests.canonical_json(stored.input) == digests.canonical_json(expected)
        assert digests.canonical_json(stored.output) == digests.canonical_json(expected)
        assert again.verify_audit("edge") == []


@pytest.mark.parametrize(
    ("text", "note", "gap"),
    [
        (2**63 - 1, 2**63 - 1, None),
        (-(2**63), -(2**63), None),
        # a guarded call's arguments nest 62 inside its run's 64-deep input; evidence 64 itself
        (nested(62), nested(63), None),
        (EMOJI, EMOJI, None),
        (UNICODE, UNICODE, None),
        (ESCAPE, ESCAPE, None),
    ],
    ids=["int64_max", "int64_min", "64_deep", "non_bmp_emoji", "unicode", "escape_sequences"],
)
def test_a_good_edge_passes_a_guarded_call_and_evidence(
    any_ledger: str, text: Any, note: Any, gap: str | None
) -> None:
    """The same edges as tool arguments (echoed in the tool's result) and as a person's evidence,
    recorded and read back as given."""
    with known_gap(gap):
        round_trip(any_ledger, text, note)


def round_trip(url: str, text: Any, note: Any) -> None:
    expected = digests.to_jsonable(text)
    with ef.Runtime(url) as rt:
        done = rt.guard(send, {"text": text}, scope="thread-1", call_id="call-1")
        assert done.value == {"id": "msg_1", "echo": expected}
        made = in_doubt(rt)
        settled = rt.resolve(
            made.effect_id, committed=True, evidence={"note": note}, by="ops", decision_id="d1"
        )
        assert settled.status is ef.StepStatus.CONFIRMED
    with ef.Runtime(url) as again:
        [guarded] = again.runs(scope="thread-1")
        assert guarded.input["arguments"] == {"text": expected}
        assert guarded.output == {"id": "msg_1", "echo": expected}
        [effect] = again.effects(run_id=made.run_id)
        assert effect.evidence == {"note": digests.to_jsonable(note)}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    CALL.clear()
    RETURNS.clear()
