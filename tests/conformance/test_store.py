"""What every ledger backend guarantees: migrations, atomic fenced batches, operation bindings,
group commit, a tamper-evident audit log, key purging and tenant isolation."""

from __future__ import annotations

import dataclasses
import itertools
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from effectflow import errors
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, RunStatus, StepStatus
from effectflow.ledger.store import Batch, DecisionRecord, LedgerStore, OperationBinding

if TYPE_CHECKING:
    from conftest import Backend

T0 = 1_700_000_000.0
TTL = 60.0


# -- record builders --------------------------------------------------------------------------------


def make_run(run_id: str = "r1", **changes: Any) -> records.RunRecord:
    run = records.RunRecord(
        run_id=run_id,
        tenant="acme",
        workflow="customer_case",
        workflow_version="1",
        input={"case_id": "92", "email": "a@example.com"},
        input_digest="sha256:input",
        status=RunStatus.RUNNING,
        output=None,
        error=None,
        next_action=NextAction.EXECUTE,
        generation=0,
        created_at=T0,
        updated_at=T0,
    )
    return dataclasses.replace(run, **changes)


def make_step(run_id: str = "r1", step_id: str = "send", **changes: Any) -> records.StepRecord:
    step = records.StepRecord(
        run_id=run_id,
        step_id=step_id,
        seq=1,
        step_revision=1,
        tool="send_email@4",
        effect_class="external_write",
        logical_operation_id=f"op_{run_id}_{step_id}",
        idempotency_key=f"efk1_{run_id}_{step_id}",
        request_digest="sha256:req",
        status=StepStatus.INTENT_RECORDED,
        completion_state=None,
        external_system="mail",
        external_effect_id=None,
        output=None,
        error=None,
        effect_id=f"eff_{run_id}_{step_id}",
        confirmed_at=None,
        next_step=None,
        compensation_status="not_required",
        next_action=NextAction.RECONCILE,
        created_at=T0,
        updated_at=T0,
    )
    return dataclasses.replace(step, **changes)


def make_effect(run_id: str = "r1", step_id: str = "send", **changes: Any) -> records.EffectRecord:
    effect = records.EffectRecord(
        effect_id=f"eff_{run_id}_{step_id}",
        tenant="acme",
        run_id=run_id,
        step_id=step_id,
        tool="send_email@4",
        tool_call_id=f"att_{run_id}_{step_id}_1",
        logical_operation_id=f"op_{run_id}_{step_id}",
        idempotency_key=f"efk1_{run_id}_{step_id}",
        request_digest="sha256:req",
        response_digest=None,
        status=StepStatus.INTENT_RECORDED,
        external_system="mail",
        external_effect_id=None,
        committed_at=None,
        approval_id=None,
        compensation_status="not_required",
        compensates=None,
        evidence=None,
        resolved_by=None,
        next_action=NextAction.RECONCILE,
        version=1,
        created_at=T0,
        updated_at=T0,
    )
    return dataclasses.replace(effect, **changes)


def make_attempt(
    run_id: str = "r1", step_id: str = "send", number: int = 1, **changes: Any
) -> records.AttemptRecord:
    attempt = records.AttemptRecord(
        attempt_id=f"att_{run_id}_{step_id}_{number}",
        run_id=run_id,
        step_id=step_id,
        number=number,
        kind=records.AttemptKind.CALL,
        generation=0,
        started_at=T0 + number,
        ended_at=None,
        outcome=None,
        error=None,
        response_digest=None,
    )
    return dataclasses.replace(attempt, **changes)


def make_binding(
    run_id: str = "r1", step_id: str = "send", digest: str = "sha256:req", **changes: Any
) -> OperationBinding:
    binding = OperationBinding(
        tenant="acme",
        logical_operation_id=f"op_{run_id}_{step_id}",
        idempotency_key=f"efk1_{run_id}_{step_id}",
        request_digest=digest,
        tool="send_email@4",
        run_id=run_id,
        step_id=step_id,
        created_at=T0,
        key_expires_at=T0 + 3600,
    )
    return dataclasses.replace(binding, **changes)


def create_run(store: LedgerStore, run_id: str = "r1", **changes: Any) -> records.RunRecord:
    """Insert a run (unfenced, as ``start`` does) with its first audit event."""
    run = make_run(run_id, **changes)
    batch = Batch(run_id, lease_token=None, new_run=run)
    batch.event("run_started", T0, workflow=run.workflow)
    store.apply(batch, lease_ttl=TTL, now=T0)
    return run


def claim(store: LedgerStore, run_id: str = "r1", owner: str = "w1") -> records.RunRecord:
    run = store.get_run(run_id)
    assert run is not None
    claimed = store.claim(run_id, owner=owner, expected_token=run.lease_token, ttl=TTL, now=T0)
    assert claimed is not None
    return claimed


def intent_batch(run: records.RunRecord, step_id: str = "send", **binding: Any) -> Batch:
    """What the write path commits before a call: binding, step, effect, attempt, audit."""
    batch = Batch(run.run_id, lease_token=run.lease_token)
    batch.operations.append(make_binding(run.run_id, step_id, **binding))
    batch.step(make_step(run.run_id, step_id))
    batch.effect(make_effect(run.run_id, step_id))
    batch.attempt(make_attempt(run.run_id, step_id))
    batch.event("intent", T0 + 1, step_id=step_id, effect_id=f"eff_{run.run_id}_{step_id}")
    return batch


def snapshot(store: LedgerStore, run_id: str) -> tuple[Any, ...]:
    """Everything the ledger holds about one run."""
    return (
        store.get_run(run_id),
        store.steps(run_id),
        store.effects(tenant=None, run_id=run_id),
        store.attempts(run_id),
        store.audit(run_id),
    )


# -- schema -----------------------------------------------------------------------------------------


def test_migrations_apply_once_and_record_their_version(backend: Backend) -> None:
    """Opening a database applies every migration once and records it; reopening is a no-op."""
    first = backend.open()
    recorded = backend.execute(
        "SELECT version, name, applied_at FROM schema_migrations ORDER BY version", ()
    )
    assert [row[0] for row in recorded] == backend.migration_versions
    assert first.schema_version() == backend.migration_versions[-1]  # type: ignore[attr-defined]
    first.close()

    second = backend.open()
    try:
        assert second.migrate() == []  # type: ignore[attr-defined]
        again = backend.execute(
            "SELECT version, name, applied_at FROM schema_migrations ORDER BY version", ()
        )
        assert again == recorded
    finally:
        second.close()


# -- batches ----------------------------------------------------------------------------------------


def test_apply_writes_every_row_of_a_batch(store: LedgerStore) -> None:
    """One batch creates the run with its steps, effects, attempts and audit events."""
    run = make_run()
    batch = Batch("r1", lease_token=None, new_run=run)
    batch.step(make_step())
    batch.effect(make_effect())
    batch.attempt(make_attempt())
    batch.event("run_started", T0, workflow="customer_case")
    batch.event("intent", T0, step_id="send", effect_id="eff_r1_send", actor="runtime", n=1)
    store.apply(batch, lease_ttl=TTL, now=T0)

    stored = store.get_run("r1")
    assert stored is not None
    assert dataclasses.replace(stored, lease_expires_at=None) == run
    assert store.steps("r1") == [make_step()]
    assert store.effects(tenant="acme", run_id="r1") == [make_effect()]
    assert store.get_effect("eff_r1_send") == make_effect()
    assert store.attempts("r1") == [make_attempt()]
    assert store.attempts("r1", "send") == [make_attempt()]
    events = store.audit("r1")
    assert [(e.kind, e.step_id, e.effect_id, e.detail) for e in events] == [
        ("run_started", None, None, {"workflow": "customer_case"}),
        ("intent", "send", "eff_r1_send", {"n": 1}),
    ]


def test_apply_to_a_missing_run_is_refused(store: LedgerStore) -> None:
    """A batch for a run that does not exist writes nothing."""
    batch = Batch("ghost", lease_token=None)
    batch.step(make_step("ghost"))
    with pytest.raises(errors.RunNotFound):
        store.apply(batch, lease_ttl=TTL, now=T0)
    assert store.steps("ghost") == []


def test_upsert_replaces_rows(store: LedgerStore) -> None:
    """A later row with the same key replaces the earlier one; run changes update the run."""
    create_run(store)
    run = claim(store)
    store.apply(intent_batch(run), lease_ttl=TTL, now=T0)

    confirmed_step = make_step(
        status=StepStatus.CONFIRMED, output={"provider_message_id": "msg_1"}, confirmed_at=T0 + 2
    )
    confirmed_effect = make_effect(
        status=StepStatus.CONFIRMED, external_effect_id="msg_1", version=2, committed_at=T0 + 2
    )
    ended = make_attempt(ended_at=T0 + 2, outcome=records.Outcome.COMMITTED)
    batch = Batch("r1", lease_token=run.lease_token)
    batch.step(confirmed_step)
    batch.effect(confirmed_effect)
    batch.attempt(ended)
    batch.run_changes.update(status=RunStatus.SUCCEEDED, output={"ok": True})
    store.apply(batch, lease_ttl=TTL, now=T0 + 2)

    assert store.steps("r1") == [confirmed_step]
    assert store.effects(tenant=None, run_id="r1") == [confirmed_effect]
    assert store.attempts("r1") == [ended]
    stored = store.get_run("r1")
    assert stored is not None
    assert (stored.status, stored.output, stored.updated_at) == (
        RunStatus.SUCCEEDED,
        {"ok": True},
        T0 + 2,
    )


# -- fencing ----------------------------------------------------------------------------------------


def test_stale_lease_token_is_refused_and_writes_nothing(store: LedgerStore) -> None:
    """A worker whose lease was taken over commits nothing: not a row, not an audit event."""
    create_run(store)
    zombie = claim(store, owner="w1")
    current = store.claim("r1", owner="w2", expected_token=zombie.lease_token, ttl=TTL, now=T0)
    assert current is not None
    before = snapshot(store, "r1")

    batch = intent_batch(zombie)
    batch.run_changes["status"] = RunStatus.FAILED
    with pytest.raises(errors.LeaseLost) as caught:
        store.apply(batch, lease_ttl=TTL, now=T0 + 1)
    assert caught.value.run_id == "r1"
    assert snapshot(store, "r1") == before
    assert store.get_operation("acme", "op_r1_send") is None

    store.apply(intent_batch(current), lease_ttl=TTL, now=T0 + 1)
    assert [s.step_id for s in store.steps("r1")] == ["send"]


def test_claim_is_compare_and_swap(store: LedgerStore) -> None:
    """Of two claims made with the same expected token, only the first wins."""
    create_run(store)
    first = store.claim("r1", owner="w1", expected_token=0, ttl=TTL, now=T0)
    assert first is not None
    assert (first.lease_owner, first.lease_token, first.lease_expires_at) == ("w1", 1, T0 + TTL)
    assert store.claim("r1", owner="w2", expected_token=0, ttl=TTL, now=T0) is None
    held = store.get_run("r1")
    assert held is not None
    assert (held.lease_owner, held.lease_token) == ("w1", 1)

    store.release("r1", token=0)  # a stale release changes nothing
    held = store.get_run("r1")
    assert held is not None
    assert held.lease_owner == "w1"
    store.release("r1", token=1)
    released = store.get_run("r1")
    assert released is not None
    assert (released.lease_owner, released.lease_expires_at) == (None, None)


def test_claim_of_a_missing_run_returns_none(store: LedgerStore) -> None:
    """Claiming a run that does not exist gets nothing."""
    assert store.claim("ghost", owner="w1", expected_token=0, ttl=TTL, now=T0) is None


def test_runs_to_recover_are_running_runs_without_a_live_lease(store: LedgerStore) -> None:
    """Running runs whose lease expired (or was never taken) are recoverable; others are not."""
    create_run(store, "never_claimed")
    create_run(store, "expired")
    store.claim("expired", owner="w1", expected_token=0, ttl=10, now=T0)
    create_run(store, "live")
    store.claim("live", owner="w1", expected_token=0, ttl=1000, now=T0)
    create_run(store, "paused", status=RunStatus.PAUSED)
    found = {r.run_id for r in store.runs_to_recover(now=T0 + 100)}
    assert found == {"never_claimed", "expired"}


# -- operation bindings -----------------------------------------------------------------------------


def test_operation_bound_to_another_digest_rolls_back_the_whole_batch(store: LedgerStore) -> None:
    """A logical operation keeps its first digest; a batch carrying another is refused entirely."""
    create_run(store)
    run = claim(store)
    store.apply(intent_batch(run), lease_ttl=TTL, now=T0)
    binding = store.get_operation("acme", "op_r1_send")
    assert binding == make_binding()

    # The same digest again (a retry after a crash) is accepted and changes nothing.
    store.apply(intent_batch(run), lease_ttl=TTL, now=T0 + 1)
    assert store.get_operation("acme", "op_r1_send") == binding

    before = snapshot(store, "r1")
    batch = Batch("r1", lease_token=run.lease_token)
    batch.step(make_step(step_id="other"))
    batch.effect(make_effect(step_id="other"))
    batch.attempt(make_attempt(step_id="other"))
    batch.run_changes["status"] = RunStatus.PAUSED
    batch.operations.append(make_binding(digest="sha256:another"))
    batch.event("intent", T0 + 2, step_id="other")
    with pytest.raises(errors.IdempotencyConflict) as caught:
        store.apply(batch, lease_ttl=TTL, now=T0 + 2)
    assert caught.value.idempotency_key == "efk1_r1_send"
    assert snapshot(store, "r1") == before
    assert store.get_operation("acme", "op_r1_send") == binding

    # A new run whose first batch conflicts is not created at all.
    fresh = Batch("r2", lease_token=None, new_run=make_run("r2"))
    fresh.operations.append(make_binding(digest="sha256:another"))
    fresh.event("run_started", T0)
    with pytest.raises(errors.IdempotencyConflict):
        store.apply(fresh, lease_ttl=TTL, now=T0)
    assert store.get_run("r2") is None
    assert store.audit("r2") == []


def test_operations_are_bound_per_tenant(store: LedgerStore) -> None:
    """The same operation id in two tenants is two operations."""
    create_run(store)
    create_run(store, "r2", tenant="globex")
    store.apply(intent_batch(claim(store)), lease_ttl=TTL, now=T0)
    other = Batch("r2", lease_token=claim(store, "r2").lease_token)
    other.operations.append(
        make_binding(
            "r2",
            tenant="globex",
            logical_operation_id="op_r1_send",
            digest="sha256:another",
            idempotency_key="efk1_globex",
        )
    )
    store.apply(other, lease_ttl=TTL, now=T0)
    acme = store.get_operation("acme", "op_r1_send")
    globex = store.get_operation("globex", "op_r1_send")
    assert acme is not None
    assert globex is not None
    assert (acme.request_digest, globex.request_digest) == ("sha256:req", "sha256:another")


# -- group commit -----------------------------------------------------------------------------------


def test_apply_many_commits_good_batches_and_reports_refused_ones(store: LedgerStore) -> None:
    """One refused batch does not sink the others of a group commit."""
    runs = {}
    for run_id in ("r1", "r2", "r3", "r4"):
        create_run(store, run_id)
        runs[run_id] = claim(store, run_id)
    store.apply(intent_batch(runs["r2"]), lease_ttl=TTL, now=T0)
    before_r2 = snapshot(store, "r2")
    before_r3 = snapshot(store, "r3")

    conflicting = Batch("r2", lease_token=runs["r2"].lease_token)
    conflicting.step(make_step("r2", "again"))
    conflicting.operations.append(make_binding("r2", digest="sha256:another"))
    stale = intent_batch(dataclasses.replace(runs["r3"], lease_token=runs["r3"].lease_token - 1))
    results = store.apply_many(
        [intent_batch(runs["r1"]), conflicting, stale, intent_batch(runs["r4"])],
        lease_ttl=TTL,
        now=T0 + 1,
    )

    assert [r.error for r in (results[0], results[3])] == [None, None]
    assert isinstance(results[1].error, errors.IdempotencyConflict)
    assert isinstance(results[2].error, errors.LeaseLost)
    assert [s.step_id for s in store.steps("r1")] == ["send"]
    assert [s.step_id for s in store.steps("r4")] == ["send"]
    assert snapshot(store, "r2") == before_r2
    assert snapshot(store, "r3") == before_r3
    assert store.verify_audit() == []


def test_a_taken_run_id_refuses_its_batch_and_only_its_batch(store: LedgerStore) -> None:
    """Creating a run whose id exists writes nothing and raises IdempotencyConflict; in a group
    commit it is that batch's refusal, not the group's (two callers may start the same run id at
    once, and the runtime then returns the run the other one created)."""
    create_run(store, "r1")
    before = snapshot(store, "r1")
    again = Batch("r1", lease_token=None, new_run=make_run("r1", input={"other": True}))
    again.event("run_started", T0 + 1, workflow="customer_case")
    with pytest.raises(errors.IdempotencyConflict, match="r1"):
        store.apply(again, lease_ttl=TTL, now=T0 + 1)
    fresh = Batch("r2", lease_token=None, new_run=make_run("r2"))
    fresh.event("run_started", T0 + 1, workflow="customer_case")
    results = store.apply_many([again, fresh], lease_ttl=TTL, now=T0 + 1)
    assert isinstance(results[0].error, errors.IdempotencyConflict)
    assert results[1].error is None
    assert snapshot(store, "r1") == before
    created = store.get_run("r2")
    assert created is not None
    assert [e.kind for e in store.audit("r2")] == ["run_started"]
    assert store.verify_audit() == []


def test_group_commits_go_on_working_after_refused_batches(store: LedgerStore) -> None:
    """Many groups in a row, each with a refused batch, on the same connection: every good batch
    commits. (On PostgreSQL, psycopg prepares a statement after a few executions and forgets its
    prepared statements when it reads a ROLLBACK; read late in a pipeline, after the next batch
    used them, it failed every later group with "prepared statement does not exist".)"""
    runs = {}
    for run_id in ("r1", "r2", "r3"):
        create_run(store, run_id)
        runs[run_id] = claim(store, run_id)
    stale = dataclasses.replace(runs["r2"], lease_token=runs["r2"].lease_token - 1)
    for n in range(12):
        batches = []
        for run in (runs["r1"], stale, runs["r3"]):
            batch = Batch(run.run_id, lease_token=run.lease_token)
            batch.event("tick", T0 + n, n=n)
            batches.append(batch)
        results = store.apply_many(batches, lease_ttl=TTL, now=T0 + n)
        assert [type(r.error).__name__ if r.error else None for r in results] == [
            None,
            "LeaseLost",
            None,
        ], f"group {n}"
    assert [e.kind for e in store.audit("r1")].count("tick") == 12
    assert [e.kind for e in store.audit("r2")].count("tick") == 0
    assert store.verify_audit() == []


# -- audit ------------------------------------------------------------------------------------------


def write_history(store: LedgerStore) -> None:
    """Two runs with a few audit events each."""
    for run_id in ("r1", "r2"):
        create_run(store, run_id)
        run = claim(store, run_id)
        store.apply(intent_batch(run), lease_ttl=TTL, now=T0 + 1)
        batch = Batch(run_id, lease_token=run.lease_token)
        batch.event("outcome", T0 + 2, step_id="send", outcome="committed", amount=500)
        batch.event("run_succeeded", T0 + 3)
        store.apply(batch, lease_ttl=TTL, now=T0 + 3)


def test_audit_chain_verifies(store: LedgerStore) -> None:
    """Each run's events chain by hash, in order, and the whole log verifies."""
    write_history(store)
    for run_id in ("r1", "r2"):
        events = store.audit(run_id)
        assert [e.kind for e in events] == ["run_started", "intent", "outcome", "run_succeeded"]
        assert [e.seq for e in events] == sorted(e.seq for e in events)
        for prev, event in itertools.pairwise(events):
            assert event.prev_hash == prev.hash
        assert len({e.hash for e in events}) == len(events)
    assert store.verify_audit() == []
    assert store.verify_audit("r1") == []


def test_audit_table_refuses_update_and_delete(backend: Backend, store: LedgerStore) -> None:
    """The database itself refuses to edit or delete an audit event."""
    write_history(store)
    events = store.audit("r1")
    with pytest.raises(backend.db_error, match="append-only"):
        backend.execute("UPDATE audit SET actor = 'mallory' WHERE seq = ?", (events[1].seq,))
    with pytest.raises(backend.db_error, match="append-only"):
        backend.execute("DELETE FROM audit WHERE seq = ?", (events[1].seq,))
    assert store.audit("r1") == events
    assert store.verify_audit() == []


def test_edited_audit_event_is_detected(backend: Backend, store: LedgerStore) -> None:
    """An attacker who drops the guard trigger and edits an event's detail is caught by verify."""
    write_history(store)
    target = store.audit("r1")[2]
    backend.execute(backend.drop_trigger_sql("audit_no_update"), ())
    backend.execute(
        "UPDATE audit SET detail_json = ? WHERE seq = ?",
        ('{"amount":5,"outcome":"committed"}', target.seq),
    )
    assert store.audit("r1")[2].detail == {"amount": 5, "outcome": "committed"}

    problems = store.verify_audit()
    assert [(p.run_id, p.seq) for p in problems] == [("r1", target.seq)]
    assert "edited" in problems[0].message
    assert store.verify_audit("r2") == []


def test_deleted_audit_event_is_detected(backend: Backend, store: LedgerStore) -> None:
    """Deleting an event from the middle, or the newest one, breaks the chain or its head."""
    write_history(store)
    middle = store.audit("r1")[1]
    newest = store.audit("r2")[-1]
    backend.execute(backend.drop_trigger_sql("audit_no_delete"), ())
    backend.execute("DELETE FROM audit WHERE seq = ?", (middle.seq,))
    backend.execute("DELETE FROM audit WHERE seq = ?", (newest.seq,))

    problems = store.verify_audit()
    assert {p.run_id for p in problems} == {"r1", "r2"}
    r2 = [p for p in problems if p.run_id == "r2"]
    assert len(r2) == 1
    assert "removed" in r2[0].message
    assert store.verify_audit("r1") != []


# -- key retention ----------------------------------------------------------------------------------


def test_purge_expired_keys_keeps_bindings_of_unsettled_steps(store: LedgerStore) -> None:
    """Expired bindings of settled steps go; those of in-doubt steps or within retention stay."""
    create_run(store)
    run = claim(store)
    batch = Batch("r1", lease_token=run.lease_token)
    for step_id, status, expires in (
        ("settled_expired", StepStatus.CONFIRMED, T0 + 10),
        ("unknown_expired", StepStatus.UNKNOWN, T0 + 10),
        ("attention_expired", StepStatus.NEEDS_ATTENTION, T0 + 10),
        ("settled_fresh", StepStatus.CONFIRMED, T0 + 1000),
    ):
        batch.step(make_step(step_id=step_id, status=status))
        batch.operations.append(make_binding(step_id=step_id, key_expires_at=expires))
    store.apply(batch, lease_ttl=TTL, now=T0)

    assert store.purge_expired_keys(now=T0 + 100) == 1
    assert store.get_operation("acme", "op_r1_settled_expired") is None
    for kept in ("unknown_expired", "attention_expired", "settled_fresh"):
        assert store.get_operation("acme", f"op_r1_{kept}") is not None
    assert store.purge_expired_keys(now=T0 + 100) == 0


# -- reads and tenants ------------------------------------------------------------------------------


def test_list_runs_filters_by_tenant_and_status(store: LedgerStore) -> None:
    """Runs are listed newest first, only the tenant's, only in the asked statuses."""
    create_run(store, "a_old", created_at=T0)
    create_run(store, "a_paused", created_at=T0 + 1, status=RunStatus.PAUSED)
    create_run(store, "a_new", created_at=T0 + 2)
    create_run(store, "b_run", created_at=T0 + 3, tenant="globex")

    def ids(**kwargs: Any) -> list[str]:
        return [r.run_id for r in store.list_runs(**kwargs)]

    assert ids(tenant="acme") == ["a_new", "a_paused", "a_old"]
    assert ids(tenant="acme", statuses=["running"]) == ["a_new", "a_old"]
    assert ids(tenant="acme", statuses=["paused", "failed"]) == ["a_paused"]
    assert ids(tenant="globex") == ["b_run"]
    assert ids(tenant="initech") == []
    assert ids(tenant=None) == ["b_run", "a_new", "a_paused", "a_old"]
    assert ids(tenant="acme", limit=1) == ["a_new"]
    assert ids(tenant="acme", before=T0 + 2) == ["a_paused", "a_old"]


def test_reads_of_another_tenant_return_nothing(store: LedgerStore) -> None:
    """Another tenant's run and effects are invisible, not an error that confirms they exist."""
    create_run(store)
    store.apply(intent_batch(claim(store)), lease_ttl=TTL, now=T0)
    assert store.get_run("r1", tenant="acme") is not None
    assert store.get_run("r1", tenant="globex") is None
    assert store.get_run("r1") is not None
    assert store.get_effect("eff_r1_send", tenant="globex") is None
    assert store.effects(tenant="globex") == []
    assert [e.effect_id for e in store.effects(tenant="acme")] == ["eff_r1_send"]


def test_effects_filter_by_status(store: LedgerStore) -> None:
    """Effects can be listed by status (the attention queue lists the unknown ones)."""
    create_run(store)
    run = claim(store)
    batch = Batch("r1", lease_token=run.lease_token)
    batch.effect(make_effect(step_id="a", status=StepStatus.CONFIRMED, created_at=T0))
    batch.effect(make_effect(step_id="b", status=StepStatus.UNKNOWN, created_at=T0 + 1))
    batch.effect(make_effect(step_id="c", status=StepStatus.NEEDS_ATTENTION, created_at=T0 + 2))
    store.apply(batch, lease_ttl=TTL, now=T0)
    found = store.effects(tenant="acme", statuses=["unknown", "needs_attention"])
    assert [e.step_id for e in found] == ["b", "c"]


def test_decisions_are_pinned(store: LedgerStore) -> None:
    """A person's decision is stored under its id and read back as it was pinned."""
    create_run(store)
    decision = DecisionRecord("dec_1", "acme", "sha256:params", "eff_r1_send", T0)
    batch = Batch("r1", lease_token=None)
    batch.decisions.append(decision)
    store.apply(batch, lease_ttl=TTL, now=T0)
    assert store.get_decision("acme", "dec_1") == decision
    assert store.get_decision("acme", "dec_2") is None
    # Ids are per tenant: another tenant's id is unknown, and free to use.
    assert store.get_decision("other", "dec_1") is None
    theirs = DecisionRecord("dec_1", "other", "sha256:theirs", "eff_r1_send", T0)
    batch = Batch("r1", lease_token=None)
    batch.decisions.append(theirs)
    store.apply(batch, lease_ttl=TTL, now=T0)
    assert store.get_decision("other", "dec_1") == theirs
    assert store.get_decision("acme", "dec_1") == decision


# -- workers ----------------------------------------------------------------------------------------


def test_claim_runnable_leases_unleased_and_expired_runs_once(store: LedgerStore) -> None:
    """Runs for workers (no lease) and runs whose lease expired are claimed, each by one worker,
    with a new token; a live lease and a paused run are left alone."""
    for run_id in ("free", "expired", "held", "paused"):
        create_run(store, run_id)
    held = claim(store, "held")
    expired = store.claim("expired", owner="dead", expected_token=0, ttl=1, now=T0)
    assert expired is not None
    pause = Batch("paused", lease_token=None)
    pause.run_changes.update(status="paused")
    store.apply(pause, lease_ttl=TTL, now=T0)

    first = store.claim_runnable(owner="w1", ttl=30, now=T0 + 10, limit=10)
    second = store.claim_runnable(owner="w2", ttl=30, now=T0 + 10, limit=10)
    assert sorted(c.run.run_id for c in first) == ["expired", "free"]
    assert second == []
    by_id = {c.run.run_id: c for c in first}
    assert by_id["expired"].run.lease_token == expired.lease_token + 1
    assert by_id["free"].run.lease_owner == "w1"
    # Who held each lease before: the takeovers a worker counts.
    assert by_id["expired"].previous_owner == "dead"
    assert by_id["free"].previous_owner is None
    assert store.get_run("held") == held
    # The former owner of "expired" can no longer write.
    with pytest.raises(errors.LeaseLost):
        store.apply(intent_batch(expired), lease_ttl=TTL, now=T0 + 11)


def test_claim_runnable_respects_the_limit_oldest_first(store: LedgerStore) -> None:
    for i, run_id in enumerate(("a", "b", "c")):
        create_run(store, run_id, created_at=T0 + i)
    claimed = store.claim_runnable(owner="w", ttl=30, now=T0 + 10, limit=2)
    assert [c.run.run_id for c in claimed] == ["a", "b"]


def test_heartbeat_extends_held_leases_and_reports_lost_ones(store: LedgerStore) -> None:
    for run_id in ("mine", "taken"):
        create_run(store, run_id)
    mine = claim(store, "mine")
    taken = claim(store, "taken")
    store.claim("taken", owner="other", expected_token=taken.lease_token, ttl=TTL, now=T0)
    lost = store.heartbeat(
        [("mine", mine.lease_token), ("taken", taken.lease_token)], ttl=100, now=T0 + 5
    )
    assert lost == ["taken"]
    renewed = store.get_run("mine")
    assert renewed is not None
    assert renewed.lease_expires_at == T0 + 105


def test_wait_for_work_returns_within_its_timeout(store: LedgerStore) -> None:
    started = time.monotonic()
    store.wait_for_work(0.05)
    assert time.monotonic() - started < 2.0


def test_claim_runnable_takes_live_leases_of_the_dead_owners_named(store: LedgerStore) -> None:
    """A live lease whose owner the caller proved dead is claimed at once (a new token fences the
    dead owner out); live leases of other owners stay."""
    for run_id in ("dead_owners", "alive_owners"):
        create_run(store, run_id)
    gone = claim(store, "dead_owners", owner="host:1:dead")
    claim(store, "alive_owners", owner="host:2:alive")
    assert store.claim_runnable(owner="w", ttl=30, now=T0 + 1, limit=10) == []
    [taken] = store.claim_runnable(
        owner="w", ttl=30, now=T0 + 1, limit=10, dead_owners=["host:1:dead", "host:1:dead"]
    )
    assert (taken.run.run_id, taken.run.lease_owner, taken.run.lease_token) == (
        "dead_owners",
        "w",
        gone.lease_token + 1,
    )
    assert taken.previous_owner == "host:1:dead"
    with pytest.raises(errors.LeaseLost):
        store.apply(intent_batch(gone), lease_ttl=TTL, now=T0 + 2)


def test_lease_owners_names_each_owner_of_a_live_lease_once(store: LedgerStore) -> None:
    """Owners of unexpired leases on running runs, each once; expired leases and paused runs are
    not named."""
    for run_id in ("a", "b", "c", "expired"):
        create_run(store, run_id)
    claim(store, "a", owner="w1")
    claim(store, "b", owner="w1")
    claim(store, "c", owner="w2")
    store.claim("expired", owner="w3", expected_token=0, ttl=1, now=T0)
    assert sorted(store.lease_owners(now=T0 + 10)) == ["w1", "w2"]


def test_effects_in_doubt_leave_out_only_runs_under_a_live_lease(store: LedgerStore) -> None:
    """In-doubt effects of ended, paused, unleased and expired runs are found; those of a run
    under a live lease, settled ones and other tenants' are not."""
    cases = {
        "failed": RunStatus.FAILED,
        "paused": RunStatus.PAUSED,
        "unleased": RunStatus.RUNNING,
        "expired": RunStatus.RUNNING,
        "live": RunStatus.RUNNING,
        "settled": RunStatus.SUCCEEDED,
    }
    for run_id in cases:
        create_run(store, run_id)
        run = claim(store, run_id)
        store.apply(intent_batch(run), lease_ttl=TTL, now=T0)
    assert store.claim("expired", owner="w2", expected_token=1, ttl=1, now=T0)
    for run_id, status in cases.items():
        if run_id in ("expired", "live"):
            continue
        done = Batch(run_id, lease_token=None)
        done.run_changes.update(status=status, lease_owner=None, lease_expires_at=None)
        if run_id == "settled":
            done.effect(make_effect(run_id, status=StepStatus.CONFIRMED, updated_at=T0 + 1))
        store.apply(done, lease_ttl=TTL, now=T0)
    found = store.effects_in_doubt(tenant="acme", now=T0 + 10)
    assert sorted(e.run_id for e in found) == ["expired", "failed", "paused", "unleased"]
    assert store.effects_in_doubt(tenant="other", now=T0 + 10) == []
    assert len(store.effects_in_doubt(tenant=None, now=T0 + 10, limit=2)) == 2


def test_a_version_5_ledger_keeps_its_approvals_and_decisions_through_version_6(
    tmp_path: Path,
) -> None:
    """Migration 6 rebuilds SQLite's approvals and decisions under per-tenant keys: the rows a
    version-5 ledger holds are all there afterwards, and readable by their tenant."""
    from effectflow.ledger import sqlite as sqlite_store

    path = tmp_path / "v5.db"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE schema_migrations "
        "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    for version, name, sql in sqlite_store.migrations():
        if version > 5:
            break
        for statement in sqlite_store._split_sql(sql):
            conn.execute(statement)
        conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (version, name))
    conn.execute(
        "INSERT INTO approvals VALUES ('APR-1', 'acme', 'r1', 's1', 'sha256:x', 'al', NULL, 1.0)"
    )
    conn.execute("INSERT INTO decisions VALUES ('DEC-1', 'acme', 'sha256:p', 'eff_1', 2.0)")
    conn.commit()
    conn.close()
    store = sqlite_store.SQLiteStore(f"sqlite:///{path}")
    try:
        assert store.schema_version() >= 6
        approval = store.get_approval("acme", "APR-1")
        assert approval is not None
        assert (approval.run_id, approval.approver) == ("r1", "al")
        decision = store.get_decision("acme", "DEC-1")
        assert decision is not None
        assert decision.effect_id == "eff_1"
        assert store.get_approval("beta", "APR-1") is None
    finally:
        store.close()
