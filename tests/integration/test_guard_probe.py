"""An adversarial probe of the guarded call (``rt.guard`` / ``guard_async``, ``rt.approve`` /
``reject`` / ``resolve``): real threads and processes against a real ledger (both backends),
checked against the provider's own record (a JSON-lines file, ``guard_probe_app``), not the
ledger's opinion.

Each test asserts what a demanding host expects. The ones effectflow gets wrong today are marked
``xfail(strict=True)`` with the finding as the reason (``_xfail_on`` marks the ones that fail on
one backend only); they pass, and must lose their marker, once src/ is fixed.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import string
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import guard_probe_app as app
import pytest

import effectflow as ef
from effectflow.runtime import guard as guard_mod
from effectflow.runtime import starting

CHILD = Path(app.__file__)
SEND = app.ARGS["gp_send"]
REFUND = {"order": "o1", "amount": 300}

# -- findings (the reasons of the xfail markers) -------------------------------------------------

RACE_DOUBLE_SEND = (
    "an original and its regenerated call started at the same moment both send: each checks for "
    "an earlier call before either run exists, then both bind the same logical operation (the "
    "store accepts a second binding with the same request digest from another run) and both call "
    "the provider with the same key; other rounds answer IdempotencyConflict"
)
CONCURRENT_LEASE_LOST = (
    "concurrent guarded calls that meet a call paused in doubt (its replays, or regenerated "
    "repeats) each resume it to look it up again; all but one get a raw LeaseLost instead of "
    "NeedsPerson about that call"
)
REPEAT_AFTER_DECISION = (
    "a repeat the conversation shows (known_call_ids) that was refused with NeedsPerson about the "
    "first call is made as a second effect once the person settles the first (resolve "
    "committed=True), or asks for a second approval once the first is approved: the LangGraph "
    "interrupt/resume loop re-asks with the same known ids"
)
CHAIN_IN_DOUBT = (
    "only the first call of an operation (its digest binding) is checked: a repeat made while an "
    "earlier *new request* of the same operation is in doubt is sent again"
)
CHAIN_REGENERATED = (
    "a regenerated copy of a knowing repeat (its turn lost) is compared with the first call only "
    "and sent again instead of being answered by the repeat it regenerates"
)
NEW_REQUEST_IN_DOUBT = (
    "new_request=True skips the check of earlier calls: a repeat is sent while an earlier call of "
    "the same tool and arguments in the scope is in doubt (known_call_ids repeats are held)"
)
COLON_COLLISION = (
    "request_operation() joins scope and call id with ':' unescaped: scope 'a:b' call 'c' and "
    "scope 'a' call 'b:c' are one logical operation, so the second request is deduplicated "
    "(never made) or refused with IdempotencyConflict; run ids are distinct (canonical JSON)"
)
BYTES_ARGUMENT = (
    "a bytes argument is accepted and the tool receives its JSON form {'$bytes': ...} (a dict), "
    "not the bytes it was given"
)
HUGE_ARGUMENT = (
    "arguments over the 1 MB limit are refused only inside the run: StepFailed, and a failed run "
    "is recorded for (scope, call_id), which is then burnt"
)
PG_NUL_SCOPE = (
    "PostgreSQL: a NUL in the scope escapes as a raw psycopg DataError from the scan for earlier "
    "calls (list_runs(scope=...)), before the input is checked; SQLite stores it"
)
PG_LONG_SCOPE = (
    "PostgreSQL: a scope over ~2.7 kB overflows the runs_by_scope index: a raw psycopg "
    "ProgramLimitExceeded (SQLite stores it), not ArgumentError"
)
PG_LONG_CALL_ID = (
    "PostgreSQL: a long call id with new_request overflows the operations key at the intent: "
    "LedgerUnavailable ('could not be reached'), and the run is left running for good"
)
KNOWN_IDS_STRING = (
    "known_call_ids given as a str is iterated as characters: '17' makes call '1' known, so a "
    "regenerated call is sent again; a str should be refused"
)
COMPENSATION_DECLINED = (
    "a declined compensation leaves the guarded call paused 'needs_attention' (its compensation "
    "'failed or missed its deadline'): a replay raises NeedsPerson in_doubt 'this may or may not "
    "have happened' for a confirmed effect, and nothing a person can do clears it"
)


@pytest.fixture(autouse=True)
def provider(tmp_path: Path) -> Path:
    path = tmp_path / "provider.jsonl"
    app.PROVIDER["file"] = str(path)
    app.MODE["untagged"] = "ok"
    app.SLOW["seconds"] = 0.0
    return path


def _backend(url: str) -> str:
    return "postgres" if url.startswith("postgresql") else "sqlite"


def _xfail_on(request: pytest.FixtureRequest, url: str, backends: set[str], reason: str) -> None:
    """Mark this test strictly expected to fail on ``backends`` (a finding on those only)."""
    if _backend(url) in backends:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def _host(ledger: str, provider: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), ledger, str(provider), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lost(rt: ef.Runtime, scope: str, call_id: str, to: str = "b") -> ef.NeedsPerson:
    """A call whose answer the provider lost: it committed, and only a person can tell."""
    app.MODE["untagged"] = "lost"
    try:
        with pytest.raises(ef.NeedsPerson) as asked:
            rt.guard(app.untagged, {"to": to}, scope=scope, call_id=call_id)
    finally:
        app.MODE["untagged"] = "ok"
    assert asked.value.kind == "in_doubt"
    return asked.value


def _answer(call: Any) -> Any:
    """What a host got: the Guarded, or the error it raised."""
    try:
        return call()
    except Exception as exc:  # the probe records whatever escaped
        return exc


def _together(*calls: Any) -> list[Any]:
    """Run the calls in threads released at the same moment; their answers, in order."""
    gate = threading.Barrier(len(calls))
    answers: list[Any] = [None] * len(calls)

    def one(i: int) -> None:
        gate.wait()
        answers[i] = _answer(calls[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return answers


# -- concurrency -----------------------------------------------------------------------------------


def test_the_original_and_a_regenerated_call_at_the_same_moment_make_one_effect(
    any_ledger: str,
) -> None:
    """Two hosts (two runtimes, two threads) make call c1 and its regenerated c2 (same tool and
    arguments, same scope) at the same moment, round after round: the provider has one message
    per round, and each host gets that message or NeedsPerson about the other call."""
    with ef.Runtime(any_ledger) as one, ef.Runtime(any_ledger) as two:
        bad: list[Any] = []
        for round_ in range(30):
            scope, to = f"race-{round_}", f"r{round_}@example.com"
            answers = _together(
                lambda rt=one, s=scope, t=to: rt.guard(
                    app.send, {**SEND, "to": t}, scope=s, call_id="c1"
                ),
                lambda rt=two, s=scope, t=to: rt.guard(
                    app.send, {**SEND, "to": t}, scope=s, call_id="c2"
                ),
            )
            sent = [r for r in app.records() if r["to"] == to]
            ok = all(isinstance(a, ef.Guarded | ef.NeedsPerson) for a in answers)
            if len(sent) != 1 or not ok:
                bad.append((round_, len(sent), [type(a).__name__ for a in answers]))
                break
        assert bad == []


@pytest.mark.parametrize("who", ["regenerated", "replays"])
def test_concurrent_calls_meeting_a_call_in_doubt_all_hear_about_it(
    any_ledger: str, who: str
) -> None:
    """c1 is in doubt (only a person can tell). Three hosts at the same moment: regenerated
    repeats c2..c4 (some knowing c1), or three replays of c1 itself. None sends; each is told a
    person must decide about c1."""
    with ef.Runtime(any_ledger) as rt:
        hosts = [ef.Runtime(any_ledger, registry=rt.registry) for _ in range(3)]
        try:
            for round_ in range(4):
                scope, to = f"doubt-{round_}", f"d{round_}"
                first = _lost(rt, scope, "c1", to)
                if who == "regenerated":
                    ids = [("c2", {"c1"}), ("c3", set()), ("c4", {"c1"})]
                else:
                    ids = [("c1", set())] * 3
                answers = _together(
                    *(
                        lambda h=h, c=c, k=k, s=scope, t=to: h.guard(
                            app.untagged, {"to": t}, scope=s, call_id=c, known_call_ids=k
                        )
                        for h, (c, k) in zip(hosts, ids, strict=True)
                    )
                )
                assert [r["to"] for r in app.records()].count(to) == 1
                assert [type(a).__name__ for a in answers] == ["NeedsPerson"] * 3, answers
                assert {a.run_id for a in answers} == {first.run_id}
        finally:
            for h in hosts:
                h.close()


def test_regenerated_calls_from_two_processes_after_the_first_host_died(
    any_ledger: str, provider: Path
) -> None:
    """The host of c1 is SIGKILLed after the provider committed; two processes then make
    regenerated calls c2 and c3 at once. The first is recovered and looked up (one of them does
    it), nothing is sent again, and each gets the message or NeedsPerson about c1."""
    killed = _host(any_ledger, provider, "gp_send", "t", "c1", "--kill")
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    [sent] = app.records()
    hosts = [_host(any_ledger, provider, "gp_send", "t", c) for c in ("c2", "c3")]
    outs = [json.loads(h.communicate(timeout=90)[0]) for h in hosts]
    with ef.Runtime(any_ledger) as rt:
        [first] = rt.runs(scope="t", call_id="c1")
        for out in outs:
            assert out.get("value") == sent or (
                out.get("error") == "NeedsPerson" and out["run_id"] == first.run_id
            ), out
        for call_id in ("c2", "c3"):  # asked again, each is answered by the first call
            done = rt.guard(app.send, SEND, scope="t", call_id=call_id)
            assert done.value == sent
            assert done.deduplicated
    assert app.records() == [sent]


def test_a_regenerated_call_is_not_held_by_a_copy_another_process_is_answering(
    any_ledger: str,
) -> None:
    """c1 happened; c3, a regenerated copy of it, is being answered by another live process at
    this moment (its run open under that process's lease). c2, regenerated too, is c1's effect:
    answered from c1, not held as if c3 might be a second effect (the race the two-process test
    above hit about one run in fifteen)."""
    with ef.Runtime(any_ledger) as rt, ef.Runtime(any_ledger, lease_ttl=60) as other:
        first = rt.guard(app.send, SEND, scope="t", call_id="c1")
        [original] = rt.runs(scope="t", call_id="c1")
        # c3's process has recorded its run (c1's operation, decided from c1) and holds its lease:
        # the state a live process leaves between starting c3's run and answering it.
        copy_input = {**original.input, "call_id": "c3"}
        run_id = guard_mod.run_id_of(rt.tenant, "t", "c3")
        starting.create(other._port, guard_mod.WORKFLOW, run_id, copy_input, leased=True)
        [copy] = rt.runs(scope="t", call_id="c3")
        assert copy.status is ef.RunStatus.RUNNING
        assert copy.lease_owner != rt.store.get_run(original.run_id).lease_owner
        again = rt.guard(app.send, SEND, scope="t", call_id="c2")
        assert again.value == first.value
        assert again.deduplicated
    assert app.records() == [first.value]


# -- repeats and earlier calls that may have happened ----------------------------------------------


@pytest.mark.parametrize("waits", ["in_doubt", "approval"])
def test_a_repeat_held_for_the_first_call_is_answered_by_the_persons_decision(
    any_ledger: str, waits: str
) -> None:
    """The LangGraph loop: the model repeats c1 (still in its conversation) while c1 waits for a
    person; the repeat is held (NeedsPerson about c1); the person settles c1 (it happened /
    approved); the host asks again. The repeat is answered by c1: one effect, one decision."""
    with ef.Runtime(any_ledger) as rt:
        if waits == "in_doubt":
            tool, arguments = app.untagged, {"to": "b"}
            first = _lost(rt, "t", "c1")
        else:
            tool, arguments = app.refund, REFUND
            with pytest.raises(ef.NeedsPerson) as asked:
                rt.guard(tool, arguments, scope="t", call_id="c1")
            first = asked.value
        with pytest.raises(ef.NeedsPerson) as held:
            rt.guard(tool, arguments, scope="t", call_id="c2", known_call_ids={"c1"})
        assert held.value.run_id == first.run_id
        if waits == "in_doubt":
            [record] = app.records()
            evidence = {"result": record}
            rt.resolve(first.effect_id or "", committed=True, evidence=evidence, by="ops")
        else:
            rt.approve(first.run_id or "", "call", approver="alice", approval_id="ap-1")
            [record] = app.records()
        # known_call_ids are the calls whose *result* the conversation shows (the middleware
        # passes those): the model was told c1 may have happened, never its result.
        again = rt.guard(tool, arguments, scope="t", call_id="c2", known_call_ids=set())
        assert again.deduplicated
        assert again.value["id"] == record["id"]
    assert len(app.records()) == 1


def test_a_repeat_while_a_knowing_repeat_is_in_doubt_is_not_sent(any_ledger: str) -> None:
    """c1 happened; c2 is a knowing repeat (a new request) whose answer was lost; c3, the model
    asking once more, must wait for c2 to be settled — not be a third message."""
    with ef.Runtime(any_ledger) as rt:
        rt.guard(app.untagged, {"to": "b"}, scope="t", call_id="c1")
        app.MODE["untagged"] = "lost"
        with pytest.raises(ef.NeedsPerson) as second:
            rt.guard(app.untagged, {"to": "b"}, scope="t", call_id="c2", known_call_ids={"c1"})
        with pytest.raises(ef.NeedsPerson) as third:
            rt.guard(
                app.untagged, {"to": "b"}, scope="t", call_id="c3", known_call_ids={"c1", "c2"}
            )
        assert third.value.run_id == second.value.run_id
    assert len(app.records()) == 2


def test_a_regenerated_copy_of_a_knowing_repeat_is_answered_by_that_repeat(
    any_ledger: str,
) -> None:
    """c1 happened; c2 is a knowing repeat (sent); the turn that showed c2 is lost and the model
    regenerates it as c3 (the conversation shows c1 only). c3 is c2 again: answered by c2."""
    with ef.Runtime(any_ledger) as rt:
        rt.guard(app.send, SEND, scope="t", call_id="c1")
        second = rt.guard(app.send, SEND, scope="t", call_id="c2", known_call_ids={"c1"})
        assert not second.deduplicated
        third = rt.guard(app.send, SEND, scope="t", call_id="c3", known_call_ids={"c1"})
        assert third.deduplicated
        assert third.value == second.value
    assert len(app.records()) == 2


def test_a_new_request_is_not_sent_while_the_same_call_is_in_doubt(any_ledger: str) -> None:
    """As for a repeat the conversation shows: a request the host names new (new_request=True)
    of the same tool and arguments waits for the call in doubt to be settled."""
    with ef.Runtime(any_ledger) as rt:
        first = _lost(rt, "t", "op-1")
        with pytest.raises(ef.NeedsPerson) as again:
            rt.guard(app.untagged, {"to": "b"}, scope="t", call_id="op-2", new_request=True)
        assert again.value.run_id == first.run_id
    assert len(app.records()) == 1


def test_known_call_ids_cannot_be_abused_into_a_second_effect(any_ledger: str) -> None:
    """known_call_ids naming the call itself, an id of another scope, or nonsense: the
    regenerated call stays deduplicated."""
    with ef.Runtime(any_ledger) as rt:
        first = rt.guard(app.send, SEND, scope="t", call_id="c1")
        rt.guard(app.send, SEND, scope="other", call_id="x1")
        for call_id, known in (("c2", {"c2"}), ("c3", {"x1"}), ("c4", {"", "C1", " c1"})):
            done = rt.guard(app.send, SEND, scope="t", call_id=call_id, known_call_ids=known)
            assert done.deduplicated
            assert done.value == first.value
    assert len(app.records()) == 2


def test_known_call_ids_given_as_a_string_is_refused(any_ledger: str) -> None:
    with ef.Runtime(any_ledger) as rt:
        rt.guard(app.send, SEND, scope="t", call_id="1")
        with pytest.raises(ef.ArgumentError, match="known_call_ids"):
            rt.guard(app.send, SEND, scope="t", call_id="2", known_call_ids="17")
    assert len(app.records()) == 1


def test_a_tool_with_each_call_new_repeated(any_ledger: str) -> None:
    """Every call id is one request, and each replay of it is that request: never a second."""
    with ef.Runtime(any_ledger) as rt:
        answers = [
            rt.guard(app.each, {"query": "z"}, scope="t", call_id=c)
            for c in ("q1", "q1", "q2", "q1", "q2", "q3")
        ]
        assert [a.value["id"] for a in answers] == ["q_1", "q_1", "q_2", "q_1", "q_2", "q_3"]
        assert not any(a.deduplicated for a in answers)
        assert len({a.run_id for a in answers}) == 3
    assert len(app.records()) == 3


# -- host ids --------------------------------------------------------------------------------------


def _digest_call_id() -> str:
    return f"gp_send:{guard_mod.request_digest(app.send, dict(SEND))}"


@pytest.mark.parametrize(
    ("tool", "first", "second"),
    [
        ("gp_send", ("a:b", "c", True), ("a", "b:c", True)),
        ("gp_each", ("a:b", "c", False), ("a", "b:c", False)),
        ("gp_send", ("s", "c1", False), ("s", "<digest>", True)),
    ],
    ids=["new_request", "each_call_new", "request_vs_operation"],
)
def test_different_host_ids_are_never_one_request(
    any_ledger: str, tool: str, first: tuple[str, str, bool], second: tuple[str, str, bool]
) -> None:
    """Two different (scope, call id) pairs that each name a request of its own are two
    requests: two effects, neither deduplicated — whatever ':' they contain."""
    arguments = app.ARGS[tool]
    with ef.Runtime(any_ledger) as rt:
        answers = []
        for scope, call_id, new in (first, second):
            call_id = _digest_call_id() if call_id == "<digest>" else call_id
            answers.append(rt.guard(tool, arguments, scope=scope, call_id=call_id, new_request=new))
        assert answers[0].run_id != answers[1].run_id
        assert not answers[1].deduplicated
        assert answers[0].value != answers[1].value
    assert len(app.records()) == 2


def test_colliding_host_ids_with_other_arguments_are_not_refused(any_ledger: str) -> None:
    with ef.Runtime(any_ledger) as rt:
        rt.guard(app.send, SEND, scope="a:b", call_id="c", new_request=True)
        other = {**SEND, "text": "another message"}
        done = rt.guard(app.send, other, scope="a", call_id="b:c", new_request=True)
        assert done.value["text"] == "another message"
    assert len(app.records()) == 2


_RNG = random.Random(7)
#: 5000 letters that do not compress (PostgreSQL compresses an index entry before its size check).
LONG = "".join(_RNG.choice(string.ascii_letters) for _ in range(5000))


@pytest.mark.parametrize(
    ("scope", "call_id"),
    [
        ("スレッド🧵/ns 1", "呼び出し-✓"),
        ("langgraph:thread 42:ns/a|b", "call:1"),
        ("x" * 2000, "c"),
        ("s", LONG[:2000]),  # the limit: 2048 bytes for both (guard_input.MAX_HOST_ID_BYTES)
        ("tab\tand\nnewline", "'; DROP TABLE runs; --"),
    ],
    ids=["unicode", "colons", "long-scope", "long-call-id", "sql-ish"],
)
def test_odd_but_storable_host_ids_are_calls_of_their_own(
    any_ledger: str, scope: str, call_id: str
) -> None:
    with ef.Runtime(any_ledger) as rt:
        done = rt.guard(app.send, SEND, scope=scope, call_id=call_id)
        assert rt.guard(app.send, SEND, scope=scope, call_id=call_id) == done
        [found] = rt.runs(scope=scope, call_id=call_id)
        assert found.run_id == done.run_id
        assert (found.scope, found.call_id) == (scope, call_id)
        other = rt.guard(app.send, SEND, scope=scope + "!", call_id=call_id)
        assert other.value != done.value
    assert len(app.records()) == 2


@pytest.mark.parametrize(
    ("scope", "call_id", "new_request", "fails_on", "reason"),
    [
        ("a\x00b", "c", False, set(), ""),
        ("s", "c\x00", False, set(), ""),
        ("s\ud800", "c", False, set(), ""),
        ("s", "c\udfff", False, set(), ""),
        (LONG[:3000], "c", False, set(), ""),
        ("s", LONG[:3000], True, set(), ""),
    ],
    ids=[
        "nul-scope",
        "nul-call-id",
        "surrogate-scope",
        "surrogate-call-id",
        "3kB-scope",
        "3kB-call-id-new-request",
    ],
)
def test_host_ids_are_stored_or_refused_clearly_with_nothing_recorded(
    request: pytest.FixtureRequest,
    any_ledger: str,
    scope: str,
    call_id: str,
    new_request: bool,
    fails_on: set[str],
    reason: str,
) -> None:
    """A host id is either a call like any other (made once, replayed, found), or an
    ArgumentError with nothing recorded and nothing sent — the same on both ledgers."""
    _xfail_on(request, any_ledger, fails_on, reason)
    with ef.Runtime(any_ledger) as rt:
        try:
            done = rt.guard(app.send, SEND, scope=scope, call_id=call_id, new_request=new_request)
        except ef.ArgumentError:
            assert rt.runs() == []
            assert app.records() == []
            return
        again = rt.guard(app.send, SEND, scope=scope, call_id=call_id, new_request=new_request)
        assert again == done
        assert [r.run_id for r in rt.runs(scope=scope, call_id=call_id)] == [done.run_id]
    assert len(app.records()) == 1


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fails_on", "reason"),
    [
        (float("nan"), set(), ""),
        (b"\x00\xffbytes", set(), ""),
        ("x" * 2_000_000, set(), ""),
        ("lone \udc00", set(), ""),
        ("a\x00b", set(), ""),
    ],
    ids=["nan", "bytes", "2MB", "surrogate", "nul"],
)
def test_an_argument_is_passed_as_given_or_refused_with_nothing_recorded(
    request: pytest.FixtureRequest,
    any_ledger: str,
    value: Any,
    fails_on: set[str],
    reason: str,
) -> None:
    """The tool receives the value the host passed (its type included), or the host gets an
    ArgumentError and nothing is recorded — no run, no effect, (scope, call id) still free."""
    _xfail_on(request, any_ledger, fails_on, reason)
    with ef.Runtime(any_ledger) as rt:
        try:
            done = rt.guard(app.typed, {"value": value}, scope="t", call_id="c")
        except ef.ArgumentError:
            assert rt.runs() == []
            assert app.records() == []
            rt.guard(app.typed, {"value": "ok"}, scope="t", call_id="c")  # the ids are still free
            return
        assert done.value["type"] == type(value).__name__
        assert rt.guard(app.typed, {"value": value}, scope="t", call_id="c") == done
    assert len(app.records()) == 1


def test_a_replay_with_other_arguments_or_another_tool_is_a_conflict(any_ledger: str) -> None:
    """(scope, call id) again with other arguments, another tool, or while the call waits for an
    approval: IdempotencyConflict, nothing recorded, nothing sent; the original is untouched."""
    with ef.Runtime(any_ledger) as rt:
        done = rt.guard(app.send, SEND, scope="t", call_id="c")
        waiting = _answer(lambda: rt.guard(app.refund, REFUND, scope="t", call_id="r"))
        assert isinstance(waiting, ef.NeedsPerson)
        audit = {r.run_id: len(rt.audit(r.run_id)) for r in rt.runs()}
        for tool, arguments, call_id in (
            (app.send, {**SEND, "text": "changed"}, "c"),
            (app.send, {"text": "hi", "to": "a@example.com", "idempotency_key": "k"}, "c"),
            (app.untagged, {"to": "a@example.com"}, "c"),
            (app.refund, {**REFUND, "amount": 301}, "r"),
            (app.send, SEND, "r"),
        ):
            with pytest.raises((ef.IdempotencyConflict, ef.ArgumentError)):
                rt.guard(tool, arguments, scope="t", call_id=call_id)
        assert {r.run_id: len(rt.audit(r.run_id)) for r in rt.runs()} == audit
        assert rt.guard(app.send, SEND, scope="t", call_id="c") == done
        assert len(rt.attention()) == 1
        rt.approve(waiting.run_id or "", "call", approver="alice", approval_id="ap-1")
        refunded = rt.guard(app.refund, REFUND, scope="t", call_id="r")
        assert refunded.value["amount"] == 300
    assert [r["id"] for r in app.records()] == ["msg_1", "rf_2"]


def test_tenants_are_separate(any_ledger: str) -> None:
    """Tenant B replaying tenant A's (scope, call id) makes B's own call; B can neither see,
    approve, decline nor resolve A's; A's regenerated call is not answered by B's."""
    with ef.Runtime(any_ledger, tenant="acme") as a, ef.Runtime(any_ledger, tenant="beta") as b:
        mine = a.guard(app.send, SEND, scope="t", call_id="c")
        waiting = _answer(lambda: a.guard(app.refund, REFUND, scope="t", call_id="r"))
        lost = _lost(a, "t", "u")
        theirs = b.guard(app.send, SEND, scope="t", call_id="c")
        assert theirs.run_id != mine.run_id
        assert theirs.value != mine.value
        assert not theirs.deduplicated
        assert [r.run_id for r in b.runs(scope="t")] == [theirs.run_id]
        with pytest.raises(ef.RunNotFound):
            b.approve(waiting.run_id, "call", approver="mallory", approval_id="ap-x")
        with pytest.raises(ef.RunNotFound):
            b.reject(waiting.run_id, "call", by="mallory", reason="no")
        with pytest.raises(ef.EffectNotFound):
            b.resolve(lost.effect_id or "", committed=False, evidence={}, by="mallory")
        with pytest.raises(ef.RunNotFound):
            b.run(mine.run_id)
        again = a.guard(app.send, SEND, scope="t", call_id="c2")
        assert again.deduplicated
        assert again.value == mine.value
    assert [r["id"] for r in app.records()] == ["msg_1", "raw_2", "msg_3"]


# -- approvals and declines ------------------------------------------------------------------------


def test_approve_after_reject_and_reject_after_approve_change_nothing(any_ledger: str) -> None:
    with ef.Runtime(any_ledger) as rt:
        declined = _answer(lambda: rt.guard(app.refund, REFUND, scope="t", call_id="no"))
        rt.reject(declined.run_id, "call", by="bob", reason="wrong order")
        with pytest.raises(ef.StaleState):
            rt.approve(declined.run_id, "call", approver="alice", approval_id="ap-late")
        with pytest.raises(ef.StepRejected, match="declined by bob: wrong order"):
            rt.guard(app.refund, REFUND, scope="t", call_id="no")
        approved = _answer(lambda: rt.guard(app.refund, REFUND, scope="u", call_id="yes"))
        rt.approve(approved.run_id, "call", approver="alice", approval_id="ap-1")
        with pytest.raises(ef.StaleState):
            rt.reject(approved.run_id, "call", by="bob", reason="too late")
        with pytest.raises(ef.StaleState):
            rt.approve(approved.run_id, "call", approver="carol", approval_id="ap-2")
        done = rt.guard(app.refund, REFUND, scope="u", call_id="yes")
        assert done.value["amount"] == 300
        assert rt.attention() == []
    assert [r["id"] for r in app.records()] == ["rf_1"]


def test_an_approval_a_decline_and_a_replay_at_the_same_moment(any_ledger: str) -> None:
    """Alice approves, Bob declines and the host replays, each from its own runtime, released
    together: one decision is recorded, the replay (then or later) tells that decision, and the
    provider has a refund exactly when the approval won."""
    with ef.Runtime(any_ledger) as rt:
        people = [ef.Runtime(any_ledger, registry=rt.registry) for _ in range(3)]
        try:
            refunds = 0
            alice, bob, host = people
            for round_ in range(5):
                scope = f"decide-{round_}"
                asked = _answer(lambda s=scope: rt.guard(app.refund, REFUND, scope=s, call_id="c"))
                assert isinstance(asked, ef.NeedsPerson)
                run_id = asked.run_id or ""
                answers = _together(
                    lambda r=run_id, n=round_: alice.approve(
                        r, "call", approver="alice", approval_id=f"ap-{n}"
                    ),
                    lambda r=run_id: bob.reject(r, "call", by="bob", reason="no"),
                    lambda s=scope: host.guard(app.refund, REFUND, scope=s, call_id="c"),
                )
                won = [isinstance(a, ef.RunRecord) for a in answers[:2]]
                assert won.count(True) == 1, answers
                assert all(isinstance(a, ef.StaleState | ef.RunRecord) for a in answers[:2])
                assert isinstance(answers[2], ef.Guarded | ef.NeedsPerson | ef.StepRejected)
                if won[0]:
                    refunds += 1
                    assert (
                        rt.guard(app.refund, REFUND, scope=scope, call_id="c").value["amount"]
                        == 300
                    )
                else:
                    with pytest.raises(ef.StepRejected):
                        rt.guard(app.refund, REFUND, scope=scope, call_id="c")
                assert len(app.records()) == refunds
        finally:
            for p in people:
                p.close()


def test_declining_a_compensation_keeps_the_call_as_it_happened(any_ledger: str) -> None:
    """The charge is done; the goal is abandoned (rt.compensate); its refund waits for approval
    and a person declines it (the approval's step is the compensation's). The charge stands: the
    call's replay is its recorded result, nothing is undone, nobody is asked again."""
    with ef.Runtime(any_ledger) as rt:
        done = rt.guard(app.charge, {"amount": 7}, scope="t", call_id="c")
        paused = rt.compensate(done.run_id, reason="customer changed their mind", by="ops")
        assert (paused.error or {}).get("code") == "approval_required"
        comp_step = (paused.error or {}).get("step_id")
        assert comp_step == "compensate:call"
        rt.reject(done.run_id, comp_step, by="bob", reason="keep the charge")
        assert rt.attention() == []
        again = rt.guard(app.charge, {"amount": 7}, scope="t", call_id="c")
        assert again.value == done.value
    assert [r["id"] for r in app.records()] == ["ch_1"]


# -- the async form, and tools that break ----------------------------------------------------------


def test_guard_async_cancelled_mid_call_then_replayed(any_ledger: str) -> None:
    """The host cancels its asyncio task while the provider is committing, then replays: the
    call was not abandoned half-way, the replay returns its result, one message."""
    app.SLOW["seconds"] = 0.4

    async def main(rt: ef.Runtime) -> tuple[ef.Guarded, ef.Guarded]:
        task = asyncio.create_task(rt.guard_async(app.send, SEND, scope="t", call_id="c"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        replay = await rt.guard_async(app.send, SEND, scope="t", call_id="c")
        regenerated = await rt.guard_async(app.send, SEND, scope="t", call_id="c2")
        return replay, regenerated

    with ef.Runtime(any_ledger) as rt:
        replay, regenerated = asyncio.run(main(rt))
        [sent] = app.records()
        assert replay.value == sent
        assert regenerated.deduplicated
        assert regenerated.value == sent
        [run] = rt.runs(scope="t", call_id="c")
        assert run.status is ef.RunStatus.SUCCEEDED
    assert len(app.records()) == 1


def test_a_tool_that_raises_a_plain_exception(any_ledger: str) -> None:
    """A ValueError before the provider committed: the lookup proves nothing happened, the key is
    retried, then a StepFailed naming the error; after it committed: the lookup finds the
    effect, and that is the answer. A pure tool's ZeroDivisionError is a StepFailed, replayed."""
    with ef.Runtime(any_ledger) as rt:
        with pytest.raises(ef.StepFailed, match=r"the tool broke \(before\)"):
            rt.guard(app.boom, {"when": "before"}, scope="t", call_id="c1")
        with pytest.raises(ef.StepFailed, match=r"the tool broke \(before\)"):
            rt.guard(app.boom, {"when": "before"}, scope="t", call_id="c1")
        assert app.records() == []
        done = rt.guard(app.boom, {"when": "after"}, scope="t", call_id="c2")
        [record] = app.records()
        assert done.value == record
        assert rt.guard(app.boom, {"when": "after"}, scope="t", call_id="c2") == done
        for _ in range(2):
            with pytest.raises(ef.StepFailed, match="pure tool broke on 1"):
                rt.guard(app.pure_boom, {"x": 1}, scope="t", call_id="c3")
    assert len(app.records()) == 1
