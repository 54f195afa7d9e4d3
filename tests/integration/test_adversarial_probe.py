"""Adversarial probes of today's changes (late answers, settles_within, workflow-changed detection,
compare-and-swap decisions, outages). Each test checks the provider's own records, not the
ledger's opinion. Eight were findings (they failed until src/ was fixed, and now guard the fixes);
the gathered-call and loops-and-branches tests probed edges that held.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectflow as ef

S = ef.StepStatus
R = ef.RunStatus
FAST = ef.RetryPolicy(max_attempts=2, max_lookups=1, initial_backoff=0.001, max_backoff=0.01)


class Provider:
    """An in-process provider: every call that commits is one row in ``done`` (its own truth)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done: list[dict[str, Any]] = []
        self.by_key: dict[str, dict[str, Any]] = {}
        self.down = 0  # how many more calls fail before anything is sent
        self.latency = 0.0  # seconds between the request's arrival and its commit
        self.reject_reads = 0
        self.revision = 1
        self.image = "app:1"
        self.races = 0  # how many times another team deploys right after our observation

    def commit(self, kind: str, key: str | None, **fields: Any) -> dict[str, Any]:
        if self.latency:
            time.sleep(self.latency)
        with self.lock:
            if key is not None and key in self.by_key:
                return {**self.by_key[key], "replayed": True}
            row = {"id": f"{kind}_{len(self.done) + 1}", "kind": kind, "key": key, **fields}
            self.done.append(row)
            if key is not None:
                self.by_key[key] = row
            return dict(row)

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.done if r["kind"] == kind]


P: list[Provider] = []


def prov() -> Provider:
    return P[-1]


@pytest.fixture
def provider() -> Iterator[Provider]:
    P.append(Provider())
    yield P[-1]
    P.pop()


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


# -- tools ------------------------------------------------------------------------------------------


@ef.tool(
    "adv_send_primary",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
    retry=FAST,
)
def send_primary(to: str, *, idempotency_key: str) -> dict[str, Any]:
    p = prov()
    with p.lock:
        if p.down:
            p.down -= 1
            raise ef.NotCommitted("primary mail provider unavailable (503)")
    return p.commit("email", idempotency_key, to=to, via="primary")


@ef.tool(
    "adv_send_backup",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
    retry=FAST,
)
def send_backup(to: str, *, idempotency_key: str) -> dict[str, Any]:
    return prov().commit("email", idempotency_key, to=to, via="backup")


@ef.tool(
    "adv_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
    retry=FAST,
)
def refund(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    return prov().commit("refund", idempotency_key, amount=amount)


@ef.tool("adv_profile", effect="read", retry=FAST)
def profile(customer: str) -> dict[str, Any]:
    p = prov()
    with p.lock:
        if p.reject_reads:
            p.reject_reads -= 1
            raise ef.Rejected("403: the CRM refused the read")
    return {"customer": customer, "name": "Ada"}


# -- finding: a failed step the workflow handled is executed again on resume ------------------------


@ef.workflow("adv_failover")
def failover(ctx: ef.Context, to: str) -> dict[str, Any]:
    try:
        sent = ctx.call("send_primary", send_primary, to=to)
    except ef.RetryBudgetExhausted:
        sent = ctx.call("send_backup", send_backup, to=to)  # the workflow's own failover
    ctx.call("refund", refund, amount=5)  # financial: pauses for an approval
    return sent


def test_a_failed_step_the_workflow_handled_is_not_executed_again_on_resume(
    db: str, provider: Provider
) -> None:
    """The primary mail provider refuses twice (NotCommitted, budget 2): the workflow catches
    RetryBudgetExhausted and sends through the backup (1 email). The refund then pauses for an
    approval; meanwhile the primary recovers. ``rt.approve`` resumes the run in a new generation.

    Expected: the recorded failure of send_primary is replayed (the workflow sees
    RetryBudgetExhausted again and reaches the confirmed send_backup), the refund runs, the run
    succeeds, and the provider holds exactly one email.
    """
    provider.down = 2
    with ef.Runtime(db) as rt:
        run = rt.start(failover, run_id="fo", to="a@example.com")
        assert run.status is R.PAUSED, run.error
        assert len(provider.of("email")) == 1
        run = rt.approve("fo", "refund", approver="ops", approval_id="APR-fo")
        emails = provider.of("email")
        assert (len(emails), run.status) == (1, R.SUCCEEDED), (emails, run.error)


# -- re-observation after a conflict that finds nothing left to do ----------------------------------


@ef.tool("adv_observe", effect="read")
def observe(target: str) -> dict[str, Any]:
    p = prov()
    with p.lock:
        seen = {"revision": p.revision, "image": p.image}
        if p.races:
            p.races -= 1
            p.revision += 1
            p.image = "app:2"  # the other team deployed the very image we wanted
    return seen


@ef.tool(
    "adv_deploy",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
    retry=FAST,
)
def deploy(target: str, image: str, *, precondition: ef.Expect, idempotency_key: str) -> Any:
    p = prov()
    with p.lock:
        if precondition.revision != p.revision:
            raise ef.Conflict(f"revision is {p.revision}, not {precondition.revision}")
        p.revision += 1
        p.image = image
    return p.commit("deploy", idempotency_key, image=image)


@ef.workflow("adv_converge")
def converge(ctx: ef.Context, image: str) -> str:
    seen = ctx.call("observe", observe, target="prod")
    if seen["image"] == image:
        return "already there"
    ctx.call(
        "deploy",
        deploy,
        target="prod",
        image=image,
        precondition=ef.Expect(revision=seen["revision"]),
        observe="observe",
    )
    return "deployed"


def test_a_reobservation_that_finds_the_goal_reached_ends_the_run(
    db: str, provider: Provider
) -> None:
    """Converge prod to app:2: observe (rev 1, app:1), another team deploys app:2 right after, our
    deploy with Expect(revision=1) conflicts, the run re-observes and now sees app:2, so the
    workflow returns "already there" without deploying.

    Expected: the run succeeds with "already there"; nothing deployed by us; no attention item (the
    conflicted call provably changed nothing). README "Preconditions": "re-runs the observation
    step and writes again on what it now sees".
    """
    provider.races = 1
    with ef.Runtime(db) as rt:
        run = rt.start(converge, run_id="cv", image="app:2")
        assert provider.of("deploy") == []
        assert (run.status, run.output) == (R.SUCCEEDED, "already there"), run.error
        assert rt.attention() == []


# -- a read step that was rejected and caught by the workflow ---------------------------------------


@ef.workflow("adv_read_fallback")
def read_fallback(ctx: ef.Context, customer: str) -> str:
    try:
        name = ctx.call("profile", profile, customer=customer)["name"]
    except ef.StepRejected:
        name = None
    if name is None:
        ctx.call("greet_generic", send_backup, to=f"{customer}: Dear customer")
    else:
        ctx.call("greet_personal", send_backup, to=f"{customer}: Dear {name}")
    ctx.call("refund", refund, amount=5)  # pauses for an approval
    return "ok"


def test_a_rejected_read_is_replayed_as_rejected(db: str, provider: Provider) -> None:
    """The CRM refuses the profile read once (ef.Rejected, recorded as the step's `rejected`); the
    workflow catches StepRejected and sends the generic greeting; the refund pauses for approval.
    ``rt.approve`` resumes: the CRM now answers.

    Expected (replay from the record, README "Pure and read results are recorded once and
    replayed"): the workflow sees the recorded rejection again, reaches the confirmed generic
    greeting, the refund runs and the run succeeds; the provider holds one greeting.
    """
    provider.reject_reads = 1
    with ef.Runtime(db) as rt:
        run = rt.start(read_fallback, run_id="rf", customer="c1")
        assert run.status is R.PAUSED, run.error
        run = rt.approve("rf", "refund", approver="ops", approval_id="APR-rf")
        assert len(provider.of("email")) == 1
        assert run.status is R.SUCCEEDED, run.error


# -- a result that cannot be recorded, caught by the workflow ---------------------------------------


@ef.tool(
    "adv_nan_send",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
    retry=FAST,
)
def nan_send(to: str, *, idempotency_key: str) -> dict[str, Any]:
    row = prov().commit("email", idempotency_key, to=to)
    return {**row, "score": math.nan}


@ef.workflow("adv_unrecordable_caught")
def unrecordable_caught(ctx: ef.Context, to: str) -> str:
    try:
        ctx.call("send", nan_send, to=to)
    except ef.ResultNotRecordable:
        ctx.call("alert_ops", send_backup, to="ops@example.com")
    ctx.call("refund", refund, amount=5)  # pauses for an approval
    return "ok"


def test_a_caught_result_not_recordable_replays_the_same_way(db: str, provider: Provider) -> None:
    """The send commits but returns NaN: the workflow gets ResultNotRecordable (as documented),
    catches it and alerts ops; the refund pauses for approval. ``rt.approve`` resumes.

    Expected: the replay raises ResultNotRecordable again (or in any case the workflow follows the
    same path), the run succeeds, one email and one alert at the provider.
    """
    with ef.Runtime(db) as rt:
        run = rt.start(unrecordable_caught, run_id="nr", to="a@example.com")
        assert run.status is R.PAUSED, run.error
        run = rt.approve("nr", "refund", approver="ops", approval_id="APR-nr")
        assert len(provider.of("email")) == 2
        assert run.status is R.SUCCEEDED, run.error


# -- settles_within=NaN ----------------------------------------------------------------------------


def test_settles_within_nan_is_refused_or_at_least_never_proves_not_found(db: str) -> None:
    """A non-idempotent post (timeout 0.2 s, the provider commits 0.6 s after the request) with a
    by-key lookup and settles_within=float("nan") (a config value that parsed as NaN).

    Expected: ef.tool refuses NaN like a negative duration (bad input gets a clear error); failing
    that, the runtime must never treat "not found" as proof while the call still runs here. What
    happens: the tool is accepted, each timeout is followed by a not-found lookup taken as proof
    and a re-send: the provider holds one post per attempt (2) for one logical operation.
    """
    posts: list[str] = []
    lock = threading.Lock()

    @ef.tool("adv_lookup_nan", effect="read")
    def lookup(*, idempotency_key: str | None = None) -> ef.Lookup:
        with lock:
            found = idempotency_key in posts
        return ef.Lookup.confirmed(external_effect_id="p") if found else ef.Lookup.not_committed()

    try:

        @ef.tool(
            "adv_post_nan",
            effect="external_write",
            confirm=lookup,
            settles_within=math.nan,
            timeout=0.2,
            retry=FAST,
        )
        def post(text: str, *, idempotency_key: str) -> dict[str, Any]:
            time.sleep(0.6)
            with lock:
                posts.append(idempotency_key)
            return {"ok": True}

    except ef.ContractError:
        return  # refused when declared: the fix

    @ef.workflow("adv_nan_flow")
    def flow(ctx: ef.Context) -> Any:
        return ctx.call("post", post, text="hi")

    with ef.Runtime(db) as rt:
        rt.start(flow, run_id="nan")
        time.sleep(0.8)  # let every call still running land
    assert len(posts) <= 1, posts


# -- settles_within is counted from the attempt's record, not from when the call was sent -----------


class Posts:
    """A provider that never deduplicates and commits ``latency`` s after a request arrives (so
    within its declared bound of 2 s), searchable by the tag (the key) the caller sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency = 1.5
        self.posts: list[str] = []
        self.arrivals: list[float] = []


POSTS: list[Posts] = []


@ef.tool("adv_find_post", effect="read")
def find_post(*, idempotency_key: str | None = None) -> ef.Lookup:
    p = POSTS[-1]
    with p.lock:
        found = idempotency_key in p.posts
    return ef.Lookup.confirmed(external_effect_id="post") if found else ef.Lookup.not_committed()


@ef.tool("adv_hold_ledger", effect="pure")
def hold_ledger(path: str, seconds: float) -> str:
    """Another writer (a second worker on the same SQLite file) holds the write lock for a while,
    starting now: the next commit of this run (its intent) waits for it."""
    import sqlite3

    held = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    threading.Thread(target=hold, daemon=True).start()
    held.wait(5)
    return "held"


@ef.tool(
    "adv_post_bounded",
    effect="external_write",
    confirm=find_post,
    effect_id="post",
    timeout=1,
    settles_within=2,
    retry=ef.RetryPolicy(max_attempts=2, max_lookups=2, initial_backoff=0.01, max_backoff=0.02),
)
def post_bounded(text: str, *, idempotency_key: str) -> dict[str, Any]:
    p = POSTS[-1]
    with p.lock:
        p.arrivals.append(time.time())
    time.sleep(p.latency)
    with p.lock:
        p.posts.append(idempotency_key)
    return {"post": f"p{len(p.posts)}"}


@ef.workflow("adv_slow_intent")
def slow_intent(ctx: ef.Context, path: str) -> Any:
    ctx.call("hold", hold_ledger, path=path, seconds=1.5)
    return ctx.call("post", post_bounded, text="hello")


def test_settles_within_counts_from_when_the_call_was_sent(tmp_path: Path) -> None:
    """settles_within=2, timeout=1, the provider commits 1.5 s after the request arrives (inside
    its bound). Another writer holds the SQLite ledger's write lock for 1.5 s just as the run
    records its intent, so the call is sent 1.5 s after its attempt's recorded start.

    Expected: the call's bound runs from when it was sent (or the call still running in this
    process is waited for): one post at the provider, the step confirmed. What happens: at the
    timeout the bound (start + 2) has already passed, the lookup finds nothing, that is taken as
    proof, and the post is sent again: two posts for one logical operation.
    """
    POSTS.append(Posts())
    path = tmp_path / "ledger.db"
    try:
        with ef.Runtime(f"sqlite:///{path}") as rt:
            run = rt.start(slow_intent, run_id="si", path=str(path))
            time.sleep(0.3 + 1.5 * (len(POSTS[-1].arrivals) > 1))
            posts = list(POSTS[-1].posts)
            assert (len(posts), run.status) == (1, R.SUCCEEDED), (posts, run.error)
    finally:
        POSTS.pop()


# -- sound: an async workflow's gather, one branch pausing for an approval while the other calls ----


@ef.tool(
    "adv_send_async",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
    retry=FAST,
)
async def send_async(to: str, *, idempotency_key: str) -> dict[str, Any]:
    import asyncio

    await asyncio.sleep(0.3)
    return prov().commit("email", idempotency_key, to=to)


@ef.workflow("adv_gather")
async def gather_flow(ctx: ef.AsyncContext, to: str) -> Any:
    import asyncio

    sent, _ = await asyncio.gather(
        ctx.call("send", send_async, to=to), ctx.call("refund", refund, amount=5)
    )
    return sent


def test_a_gathered_call_cut_short_by_an_approval_pause_stays_in_sight(
    db: str, provider: Provider
) -> None:
    """asyncio.gather(send, refund): the refund pauses for an approval while the send is in its
    call; the run's loop ends and the send's task is cancelled mid-call. The send's effect must be
    listed by rt.attention() while the run waits, and after the approval the run succeeds with one
    email (retried with its original key)."""
    with ef.Runtime(db) as rt:
        run = rt.start(gather_flow, run_id="ga", to="a@example.com")
        assert run.status is R.PAUSED
        [send] = [s for s in rt.steps("ga") if s.step_id == "send"]
        if send.status is not S.CONFIRMED:
            assert send.effect_id in [i.effect_id for i in rt.attention()]
        run = rt.approve("ga", "refund", approver="ops", approval_id="APR-ga")
        assert run.status is R.SUCCEEDED, run.error
    assert len(provider.of("email")) == 1
    assert len(provider.of("refund")) == 1


# -- a person's "not committed" while the call still runs here; then its late commit ----------------


@ef.tool(
    "adv_post_unbounded",
    effect="external_write",
    confirm=find_post,
    effect_id="post",
    timeout=0.2,
    settles_within="unbounded",
    retry=ef.RetryPolicy(max_attempts=2, max_lookups=1, initial_backoff=0.01, max_backoff=0.02),
)
def post_unbounded(text: str, *, idempotency_key: str) -> dict[str, Any]:
    p = POSTS[-1]
    time.sleep(p.latency)
    with p.lock:
        p.posts.append(idempotency_key)
    return {"post": f"p{len(p.posts)}"}


@ef.workflow("adv_hung")
def hung(ctx: ef.Context) -> Any:
    return ctx.call("post", post_unbounded, text="hello")


def test_a_late_commit_after_a_not_committed_resolution_is_not_lost(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unbounded, non-idempotent post hangs 1 s (timeout 0.2): the lookup finds nothing, the
    run pauses for a person while the call still runs in this process. Alice resolves it
    committed=False (she looked and saw nothing yet). Then the call commits and its late answer
    comes back: a fact contradicting her decision.

    Expected (docs/concepts.md#no-effect-out-of-sight; never two effects): the contradicted
    effect is listed by rt.attention() (or confirmed), and rt.resume does not post a second time.
    """
    from effectflow.runtime import lookup

    monkeypatch.setattr(lookup, "LATE_ANSWER_WAIT", 0.1)
    POSTS.append(Posts())
    POSTS[-1].latency = 1.0
    try:
        with ef.Runtime(db) as rt:
            run = rt.start(hung, run_id="hg")
            assert run.status is R.PAUSED, run.error
            [step] = rt.steps("hg")
            assert step.effect_id is not None
            effect = next(e for e in rt.effects(run_id="hg"))
            rt.resolve(
                effect.effect_id,
                committed=False,
                evidence={"seen_in": "provider dashboard"},
                by="alice",
                expected_version=effect.version,
            )
            deadline = time.time() + 5
            while not POSTS[-1].posts and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)  # the late answer is recorded
            [effect] = rt.effects(run_id="hg")
            listed = effect.effect_id in [i.effect_id for i in rt.attention()]
            in_sight = listed or effect.status is S.CONFIRMED
            rt.resume("hg")
            time.sleep(1.2)
            posts = len(POSTS[-1].posts)
            assert (in_sight, posts) == (True, 1), (effect.status, posts)
    finally:
        POSTS.pop()


def test_a_cancelled_run_whose_call_lands_late_concludes(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unbounded post hangs 1 s; the run pauses for a person while the call still runs here.
    The operator cancels: the one lookup finds nothing that proves anything, so the run is
    cancelled_pending_reconciliation with the effect unknown. The call then commits and its late
    answer confirms the effect (attention empties, as it should).

    Expected: rt.reconcile() (README: "moved on by rt.reconcile or a person's rt.resolve") moves
    the run to cancelled_with_effects, the effect in its inventory as confirmed. One post.
    """
    from effectflow.runtime import lookup

    monkeypatch.setattr(lookup, "LATE_ANSWER_WAIT", 0.1)
    POSTS.append(Posts())
    POSTS[-1].latency = 1.0
    try:
        with ef.Runtime(db) as rt:
            assert rt.start(hung, run_id="cl").status is R.PAUSED
            inv = rt.cancel("cl", reason="customer left")
            assert inv.status is R.CANCELLED_PENDING_RECONCILIATION
            deadline = time.time() + 5
            while rt.effects(run_id="cl")[0].status is not S.CONFIRMED and time.time() < deadline:
                time.sleep(0.05)
            assert rt.attention() == []
            rt.reconcile()
            assert len(POSTS[-1].posts) == 1
            assert rt.run("cl").status is R.CANCELLED_WITH_EFFECTS
    finally:
        POSTS.pop()


# -- sound: loops and branches on recorded reads, across an approval pause --------------------------


@ef.workflow("adv_loop_branch")
def loop_branch(ctx: ef.Context, customers: list[str]) -> int:
    sent = 0
    for c in customers:
        name = ctx.call(f"profile_{c}", profile, customer=c)["name"]
        if name == "Ada":
            ctx.call(f"greet_{c}", send_backup, to=f"{c}: Dear {name}")
            sent += 1
        else:
            ctx.call(f"generic_{c}", send_primary, to=c)
    ctx.call("refund", refund, amount=len(customers))
    ctx.call("final_note", send_backup, to="ops@example.com")
    return sent


def test_loops_and_branches_on_recorded_reads_resume_without_a_false_alarm(
    db: str, provider: Provider
) -> None:
    """A loop over three customers, each a read then a branch to one of two writes, then an
    approval pause, then one more write: after rt.approve the run succeeds (no workflow_changed),
    and the provider holds one email per customer plus the final note, one refund."""
    with ef.Runtime(db) as rt:
        run = rt.start(loop_branch, run_id="lb", customers=["c1", "c2", "c3"])
        assert run.status is R.PAUSED, run.error
        run = rt.approve("lb", "refund", approver="ops", approval_id="APR-lb")
        assert (run.status, run.output) == (R.SUCCEEDED, 3), run.error
    assert len(provider.of("email")) == 4
    assert len(provider.of("refund")) == 1
