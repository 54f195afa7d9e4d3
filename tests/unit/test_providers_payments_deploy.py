"""The payments and deploy providers behave like the APIs they stand for, durably, across processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import effectflow.testing
from effectflow.testing.providers import (
    DeployTarget,
    IdempotencyKeyReused,
    PaymentsProvider,
    ProviderError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    RevisionConflict,
)
from worlds import FakeClock

T0_ISO = "2023-11-14T22:13:20.000000+00:00"
PROD = "deployment/prod"


@pytest.fixture
def payments(tmp_path: Path, clock: FakeClock) -> Iterator[PaymentsProvider]:
    provider = PaymentsProvider(tmp_path / "payments.db", clock=clock)
    yield provider
    provider.close()


@pytest.fixture
def deploy(tmp_path: Path, clock: FakeClock) -> Iterator[DeployTarget]:
    provider = DeployTarget(tmp_path / "deploy.db", clock=clock)
    yield provider
    provider.close()


def _child_env() -> dict[str, str]:
    src = Path(__file__).resolve().parents[2] / "src"
    return {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_new_providers_are_exported_from_effectflow_testing() -> None:
    """PaymentsProvider, DeployTarget and RevisionConflict are public in effectflow.testing."""
    for name in ("PaymentsProvider", "DeployTarget", "RevisionConflict"):
        assert name in effectflow.testing.__all__
        assert getattr(effectflow.testing, name) is not None
    assert effectflow.testing.__all__ == sorted(effectflow.testing.__all__)


# -- payments: create ----------------------------------------------------------------------------


def test_create_refund_returns_succeeded_with_sequential_ids(payments: PaymentsProvider) -> None:
    """A refund answers succeeded with a re_<n> id and an ISO-8601 UTC timestamp."""
    first = payments.create_refund("pay_1", 500, idempotency_key="k1", metadata={"op": "x"})
    second = payments.create_refund("pay_1", 200, idempotency_key="k2")
    assert first == {
        "refund_id": "re_1",
        "payment_id": "pay_1",
        "amount": 500,
        "status": "succeeded",
        "created_at": T0_ISO,
        "replayed": False,
    }
    assert second["refund_id"] == "re_2"
    assert payments.refunds()[0] == {
        "refund_id": "re_1",
        "payment_id": "pay_1",
        "amount": 500,
        "status": "succeeded",
        "created_at": T0_ISO,
        "idempotency_key": "k1",
        "metadata": {"op": "x"},
    }


def test_refund_same_key_same_payload_replays_within_retention(
    payments: PaymentsProvider, clock: FakeClock
) -> None:
    """A retry with the same key and payload within retention replays and refunds nothing."""
    original = payments.create_refund("pay_1", 500, idempotency_key="k1")
    clock.advance(86400.0)
    replay = payments.create_refund("pay_1", 500, idempotency_key="k1")
    assert replay == {**original, "replayed": True}
    assert payments.count_refunds() == 1
    assert [c["outcome"] for c in payments.calls("create_refund")] == ["ok", "replayed"]


def test_refund_key_forgotten_after_retention_refunds_twice(
    tmp_path: Path, clock: FakeClock
) -> None:
    """After key_retention the key is forgotten: a retry creates a second refund, as on Stripe."""
    with PaymentsProvider(tmp_path / "p.db", clock=clock, key_retention=100.0) as payments:
        payments.create_refund("pay_1", 500, idempotency_key="k1")
        clock.advance(100.5)
        assert payments.get_refund_by_idempotency_key("k1") is None
        again = payments.create_refund("pay_1", 500, idempotency_key="k1")
        assert (again["refund_id"], again["replayed"]) == ("re_2", False)
        assert payments.count_refunds("pay_1") == 2
        found = payments.get_refund_by_idempotency_key("k1")
        assert found is not None
        assert found["refund_id"] == "re_2"


def test_refund_same_key_different_payload_is_refused_and_writes_nothing(
    payments: PaymentsProvider,
) -> None:
    """The same key with another amount, payment or metadata raises and changes nothing."""
    payments.create_refund("pay_1", 500, idempotency_key="k1")
    for payment_id, amount, metadata in (
        ("pay_1", 501, None),
        ("pay_2", 500, None),
        ("pay_1", 500, {"op": "y"}),
    ):
        with pytest.raises(IdempotencyKeyReused) as info:
            payments.create_refund(payment_id, amount, idempotency_key="k1", metadata=metadata)
        assert (info.value.code, info.value.status) == ("idempotency_key_reused", 422)
        assert info.value.idempotency_key == "k1"
    assert [(r["payment_id"], r["amount"]) for r in payments.refunds()] == [("pay_1", 500)]


@pytest.mark.parametrize(
    ("payment_id", "amount", "code", "status"),
    [
        ("pay_1", 0, "invalid_amount", 400),
        ("pay_1", -5, "invalid_amount", 400),
        ("pay_1", 1.5, "invalid_amount", 400),
        ("pay_1", True, "invalid_amount", 400),
        ("ch_1", 100, "no_such_payment", 404),
        ("pay_1", 1_000_001, "amount_too_large", 400),
    ],
)
def test_invalid_refunds_are_rejected_and_write_nothing(
    payments: PaymentsProvider, payment_id: str, amount: int, code: str, status: int
) -> None:
    """Bad amounts and unknown payments raise ProviderRejected with a stable code, refunding nothing."""
    with pytest.raises(ProviderRejected) as info:
        payments.create_refund(payment_id, amount, idempotency_key="k1")
    assert (info.value.code, info.value.status) == (code, status)
    assert payments.refunds() == []
    assert payments.get_refund_by_idempotency_key("k1") is None
    assert payments.calls()[0]["outcome"] == code


def test_refund_total_is_capped_per_payment_but_cancelled_refunds_free_it(
    payments: PaymentsProvider,
) -> None:
    """Refunds beyond 1,000,000 per payment are refused; a cancelled refund no longer counts."""
    payments.create_refund("pay_1", 600_000, idempotency_key="k1")
    with pytest.raises(ProviderRejected) as info:
        payments.create_refund("pay_1", 400_001, idempotency_key="k2")
    assert info.value.code == "amount_too_large"
    payments.create_refund("pay_2", 1_000_000, idempotency_key="k3")
    payments.cancel_refund("re_1", idempotency_key="c1")
    assert payments.create_refund("pay_1", 1_000_000, idempotency_key="k2")["replayed"] is False
    # A replay is answered even though the payment is now fully refunded.
    assert payments.create_refund("pay_1", 1_000_000, idempotency_key="k2")["replayed"] is True


# -- payments: cancel ----------------------------------------------------------------------------


def test_cancel_within_window_cancels(payments: PaymentsProvider, clock: FakeClock) -> None:
    """Cancelling inside cancel_window marks the refund canceled with canceled_at."""
    payments.create_refund("pay_1", 500, idempotency_key="k1")
    clock.advance(600.0)
    cancelled = payments.cancel_refund("re_1", idempotency_key="c1")
    assert cancelled == {
        "refund_id": "re_1",
        "payment_id": "pay_1",
        "amount": 500,
        "status": "canceled",
        "created_at": T0_ISO,
        "canceled_at": "2023-11-14T22:23:20.000000+00:00",
        "replayed": False,
    }
    refund = payments.get_refund("re_1")
    assert refund is not None
    assert (refund["status"], refund["canceled_at"]) == ("canceled", cancelled["canceled_at"])
    assert payments.count_refunds(status="succeeded") == 0
    assert payments.count_refunds() == 1


def test_cancel_after_window_is_rejected(payments: PaymentsProvider, clock: FakeClock) -> None:
    """After cancel_window the cancel is refused (cancel_window_expired) and the refund stands."""
    payments.create_refund("pay_1", 500, idempotency_key="k1")
    clock.advance(600.001)
    with pytest.raises(ProviderRejected) as info:
        payments.cancel_refund("re_1", idempotency_key="c1")
    assert (info.value.code, info.value.status) == ("cancel_window_expired", 409)
    refund = payments.get_refund("re_1")
    assert refund is not None
    assert refund["status"] == "succeeded"
    assert "canceled_at" not in refund


def test_cancel_same_key_replays_and_other_key_is_refused(
    payments: PaymentsProvider, clock: FakeClock
) -> None:
    """A cancel retried with its key replays, even after the window; a new key is refused."""
    payments.create_refund("pay_1", 500, idempotency_key="k1")
    first = payments.cancel_refund("re_1", idempotency_key="c1")
    clock.advance(3600.0)
    assert payments.cancel_refund("re_1", idempotency_key="c1") == {**first, "replayed": True}
    with pytest.raises(ProviderRejected) as info:
        payments.cancel_refund("re_1", idempotency_key="c2")
    assert (info.value.code, info.value.status) == ("refund_already_canceled", 409)
    assert [c["outcome"] for c in payments.calls("cancel_refund")] == [
        "ok",
        "replayed",
        "refund_already_canceled",
    ]


def test_cancel_key_reuse_and_unknown_refund(payments: PaymentsProvider) -> None:
    """Cancel keys share the namespace with creates; unknown refunds are no_such_refund."""
    payments.create_refund("pay_1", 500, idempotency_key="k1")
    payments.create_refund("pay_1", 500, idempotency_key="k2")
    payments.cancel_refund("re_1", idempotency_key="c1")
    with pytest.raises(IdempotencyKeyReused):
        payments.cancel_refund("re_2", idempotency_key="c1")
    with pytest.raises(IdempotencyKeyReused):
        payments.cancel_refund("re_2", idempotency_key="k1")
    assert payments.get_refund("re_2")["status"] == "succeeded"  # type: ignore[index]
    for refund_id in ("re_99", "garbage"):
        with pytest.raises(ProviderRejected) as info:
            payments.cancel_refund(refund_id, idempotency_key="c9")
        assert (info.value.code, info.value.status) == ("no_such_refund", 404)


def test_refund_lookups_by_key_and_id(payments: PaymentsProvider) -> None:
    """Lookups find a refund by its create key or its id; cancel keys and strangers find nothing."""
    created = payments.create_refund("pay_1", 500, idempotency_key="k1")
    payments.cancel_refund("re_1", idempotency_key="c1")
    by_key = payments.get_refund_by_idempotency_key("k1")
    assert by_key == payments.get_refund(created["refund_id"])
    assert by_key is not None
    assert by_key["status"] == "canceled"
    assert payments.get_refund_by_idempotency_key("c1") is None
    assert payments.get_refund_by_idempotency_key("nope") is None
    assert payments.get_refund("re_9") is None
    assert payments.get_refund("msg_1") is None
    assert payments.refunds(payment_id="pay_2") == []


def test_payments_constructor_validates_its_windows(tmp_path: Path) -> None:
    """key_retention must be positive and cancel_window not negative."""
    with pytest.raises(ValueError):
        PaymentsProvider(tmp_path / "p.db", key_retention=0)
    with pytest.raises(ValueError):
        PaymentsProvider(tmp_path / "p.db", cancel_window=-1)


# -- payments: faults ----------------------------------------------------------------------------


def test_refund_lose_response_commits_then_times_out(payments: PaymentsProvider) -> None:
    """lose_response commits the refund, then raises ProviderTimeout; a keyed retry replays."""
    payments.inject("create_refund", "lose_response")
    with pytest.raises(ProviderTimeout) as info:
        payments.create_refund("pay_1", 500, idempotency_key="k1")
    assert info.value.key == "k1"
    assert payments.count_refunds() == 1
    assert payments.get_refund_by_idempotency_key("k1") is not None
    assert payments.create_refund("pay_1", 500, idempotency_key="k1")["replayed"] is True
    assert [c["fault"] for c in payments.calls()] == ["lose_response", None]


def test_cancel_lose_response_commits_then_times_out(payments: PaymentsProvider) -> None:
    """A lost cancel response still cancels; the retry with the same key replays."""
    payments.create_refund("pay_1", 500, idempotency_key="k1")
    payments.inject("cancel_refund", "lose_response")
    with pytest.raises(ProviderTimeout):
        payments.cancel_refund("re_1", idempotency_key="c1")
    assert payments.get_refund("re_1")["status"] == "canceled"  # type: ignore[index]
    assert payments.cancel_refund("re_1", idempotency_key="c1")["replayed"] is True


@pytest.mark.parametrize(
    ("fault", "raised"),
    [
        ("fail_before_commit", ProviderUnavailable),
        ("timeout_before_commit", ProviderTimeout),
        ("reject", ProviderRejected),
    ],
)
def test_payments_faults_before_commit_commit_nothing(
    payments: PaymentsProvider, fault: str, raised: type[Exception]
) -> None:
    """Faults before commit raise and neither refund nor cancel anything."""
    payments.inject("create_refund", fault)  # type: ignore[arg-type]
    with pytest.raises(raised):
        payments.create_refund("pay_1", 500, idempotency_key="k1")
    assert payments.refunds() == []
    assert payments.get_refund_by_idempotency_key("k1") is None
    payments.create_refund("pay_1", 500, idempotency_key="k1")
    payments.inject("cancel_refund", fault)  # type: ignore[arg-type]
    with pytest.raises(raised):
        payments.cancel_refund("re_1", idempotency_key="c1")
    assert payments.get_refund("re_1")["status"] == "succeeded"  # type: ignore[index]
    assert [c["outcome"] for c in payments.calls()] == ["not_committed", "ok", "not_committed"]


def test_payments_inject_refuses_lookups(payments: PaymentsProvider) -> None:
    """Only writes take faults: lookups are reads and cannot be injected."""
    with pytest.raises(ValueError):
        payments.inject("get_refund", "lose_response")


# -- deploy: compare-and-swap ----------------------------------------------------------------


def test_observe_fresh_and_seeded_targets(deploy: DeployTarget) -> None:
    """A fresh target reads as revision 1 with no image; seed sets a starting state once."""
    assert deploy.observe("deployment/new") == {
        "target": "deployment/new",
        "revision": 1,
        "image": None,
        "etag": '"r1"',
    }
    deploy.seed(PROD, "app:1", revision=7)
    assert deploy.observe(PROD) == {
        "target": PROD,
        "revision": 7,
        "image": "app:1",
        "etag": '"r7"',
    }
    with pytest.raises(ValueError):
        deploy.seed(PROD, "app:2")
    with pytest.raises(ValueError):
        deploy.seed("deployment/other", "app:1", revision=0)
    assert deploy.history(PROD) == []
    assert deploy.calls() == []


def test_cas_deploy_succeeds_on_the_expected_revision(deploy: DeployTarget) -> None:
    """A deploy expecting the current revision bumps it and answers with the new state."""
    deploy.seed(PROD, "app:1")
    result = deploy.deploy(PROD, "app:2", expected_revision=1)
    assert result == {
        "target": PROD,
        "revision": 2,
        "previous_revision": 1,
        "image": "app:2",
        "deployment_id": "dep_1",
        "etag": '"r2"',
        "replayed": False,
    }
    assert deploy.observe(PROD)["image"] == "app:2"
    assert deploy.history(PROD) == [
        {
            "deployment_id": "dep_1",
            "target": PROD,
            "revision": 2,
            "based_on": 1,
            "expected_revision": 1,
            "image": "app:2",
            "writer": "us",
            "idempotency_key": None,
            "deployed_at": T0_ISO,
        }
    ]
    assert deploy.overwrites(PROD) == 0


def test_stale_expected_revision_conflicts_and_writes_nothing(deploy: DeployTarget) -> None:
    """A deploy on a stale revision raises RevisionConflict (412) and changes nothing."""
    deploy.seed(PROD, "app:1")
    seen = deploy.observe(PROD)
    other = deploy.concurrent_deploy(PROD, "theirs:1")
    assert (other["revision"], other["previous_revision"]) == (2, 1)
    with pytest.raises(RevisionConflict) as info:
        deploy.deploy(PROD, "app:2", expected_revision=seen["revision"], idempotency_key="d1")
    conflict = info.value
    assert isinstance(conflict, ProviderError)
    assert not isinstance(conflict, ProviderRejected)
    assert (conflict.code, conflict.status) == ("revision_mismatch", 412)
    assert (conflict.target, conflict.expected, conflict.current) == (PROD, 1, 2)
    assert deploy.observe(PROD)["image"] == "theirs:1"
    assert [d["writer"] for d in deploy.history(PROD)] == ["other"]
    # The refused request left nothing under its key: a retry on a fresh view may use it.
    assert deploy.get_deployment_by_idempotency_key("d1") is None
    retry = deploy.deploy(PROD, "app:2", expected_revision=2, idempotency_key="d1")
    assert (retry["revision"], retry["replayed"]) == (3, False)
    assert [c["outcome"] for c in deploy.calls("deploy")] == ["revision_mismatch", "ok"]
    assert deploy.overwrites(PROD) == 0


def test_if_match_etag_is_the_same_precondition(deploy: DeployTarget) -> None:
    """if_match takes the observed ETag: it succeeds when fresh and conflicts when stale."""
    deploy.seed(PROD, "app:1")
    first = deploy.deploy(PROD, "app:2", if_match=deploy.observe(PROD)["etag"])
    assert first["revision"] == 2
    assert deploy.history(PROD)[0]["expected_revision"] == 1
    with pytest.raises(RevisionConflict) as info:
        deploy.deploy(PROD, "app:3", if_match='"r1"')
    assert (info.value.expected, info.value.current) == (1, 2)
    assert deploy.deploy(PROD, "app:3", if_match='"r2"', expected_revision=2)["revision"] == 3


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"if_match": "r1"}, "invalid_precondition"),
        ({"if_match": '"1"'}, "invalid_precondition"),
        ({"if_match": '"r1"', "expected_revision": 2}, "invalid_precondition"),
        ({"image": ""}, "invalid_field"),
        ({"target": ""}, "invalid_field"),
    ],
)
def test_malformed_deploys_are_rejected(
    deploy: DeployTarget, kwargs: dict[str, object], code: str
) -> None:
    """A bad ETag, disagreeing preconditions or empty fields are refused with a 400."""
    args: dict[str, object] = {"target": PROD, "image": "app:2", **kwargs}
    with pytest.raises(ProviderRejected) as info:
        deploy.deploy(**args)  # type: ignore[arg-type]
    assert (info.value.code, info.value.status) == (code, 400)
    assert deploy.history(PROD) == []
    assert deploy.observe(PROD)["revision"] == 1


def test_concurrent_deploy_bumps_revision_as_another_writer(deploy: DeployTarget) -> None:
    """concurrent_deploy deploys blindly as "other" and is logged, taking no injected faults."""
    deploy.inject("deploy", "fail_before_commit")
    first = deploy.concurrent_deploy(PROD, "theirs:1")
    second = deploy.concurrent_deploy(PROD, "theirs:2")
    assert (first["revision"], second["revision"]) == (2, 3)
    assert deploy.observe(PROD) == {
        "target": PROD,
        "revision": 3,
        "image": "theirs:2",
        "etag": '"r3"',
    }
    assert [(d["writer"], d["expected_revision"]) for d in deploy.history(PROD)] == [
        ("other", None),
        ("other", None),
    ]
    assert [c["operation"] for c in deploy.calls()] == ["concurrent_deploy"] * 2
    with pytest.raises(ProviderUnavailable):
        deploy.deploy(PROD, "app:2")
    with pytest.raises(ValueError):
        deploy.inject("concurrent_deploy", "reject")


def test_keyed_deploy_replays_even_after_the_revision_moved(deploy: DeployTarget) -> None:
    """The same key and payload replays the first answer, though others deployed since."""
    first = deploy.deploy(PROD, "app:2", expected_revision=1, idempotency_key="d1")
    deploy.concurrent_deploy(PROD, "theirs:1")
    replay = deploy.deploy(PROD, "app:2", expected_revision=1, idempotency_key="d1")
    assert replay == {**first, "replayed": True}
    assert deploy.observe(PROD)["image"] == "theirs:1"
    assert len(deploy.history(PROD)) == 2
    found = deploy.get_deployment_by_idempotency_key("d1")
    assert found is not None
    assert (found["deployment_id"], found["writer"], found["idempotency_key"]) == (
        "dep_1",
        "us",
        "d1",
    )
    assert deploy.get_deployment_by_idempotency_key("nope") is None


def test_keyed_deploy_different_payload_is_refused(deploy: DeployTarget) -> None:
    """The same key with another image or precondition raises and writes nothing."""
    deploy.deploy(PROD, "app:2", expected_revision=1, idempotency_key="d1")
    with pytest.raises(IdempotencyKeyReused):
        deploy.deploy(PROD, "app:3", expected_revision=2, idempotency_key="d1")
    with pytest.raises(IdempotencyKeyReused):
        deploy.deploy(PROD, "app:2", idempotency_key="d1")
    assert deploy.observe(PROD)["revision"] == 2
    assert len(deploy.history(PROD)) == 1


def test_if_match_and_expected_revision_are_one_payload_under_a_key(deploy: DeployTarget) -> None:
    """A keyed retry may spell its precondition either way and still replay."""
    first = deploy.deploy(PROD, "app:2", expected_revision=1, idempotency_key="d1")
    assert deploy.deploy(PROD, "app:2", if_match='"r1"', idempotency_key="d1") == {
        **first,
        "replayed": True,
    }


def test_overwrites_counts_blind_deploys_over_another_writer(deploy: DeployTarget) -> None:
    """Blind deploys over another writer's revision count; over seed or our own, they do not."""
    deploy.seed(PROD, "app:1")
    deploy.deploy(PROD, "app:2")  # blind over seeded state
    deploy.deploy(PROD, "app:3")  # blind over our own revision
    assert deploy.overwrites(PROD) == 0
    deploy.concurrent_deploy(PROD, "theirs:1")
    deploy.deploy(PROD, "app:4")  # blind over theirs: a lost update
    assert deploy.overwrites(PROD) == 1
    deploy.concurrent_deploy(PROD, "theirs:2")
    deploy.deploy(PROD, "app:5", expected_revision=deploy.observe(PROD)["revision"])
    assert deploy.overwrites(PROD) == 1
    assert deploy.overwrites("deployment/other") == 0


# -- deploy: faults ------------------------------------------------------------------------------


def test_deploy_lose_response_commits_then_times_out(deploy: DeployTarget) -> None:
    """lose_response applies the deploy, then raises; the keyed retry replays, not conflicts."""
    deploy.inject("deploy", "lose_response")
    with pytest.raises(ProviderTimeout):
        deploy.deploy(PROD, "app:2", expected_revision=1, idempotency_key="d1")
    assert deploy.observe(PROD)["revision"] == 2
    assert deploy.get_deployment_by_idempotency_key("d1") is not None
    retry = deploy.deploy(PROD, "app:2", expected_revision=1, idempotency_key="d1")
    assert (retry["revision"], retry["replayed"]) == (2, True)
    # Without the key the same retry is a conflict: the precondition has been consumed.
    with pytest.raises(RevisionConflict):
        deploy.deploy(PROD, "app:2", expected_revision=1)


def test_deploy_lose_response_hides_a_conflict(deploy: DeployTarget) -> None:
    """A lost response hides even an error: the conflict becomes a timeout, nothing written."""
    deploy.concurrent_deploy(PROD, "theirs:1")
    deploy.inject("deploy", "lose_response")
    with pytest.raises(ProviderTimeout) as info:
        deploy.deploy(PROD, "app:2", expected_revision=1)
    assert isinstance(info.value.__cause__, RevisionConflict)
    assert [d["writer"] for d in deploy.history(PROD)] == ["other"]


@pytest.mark.parametrize(
    ("fault", "raised"),
    [
        ("fail_before_commit", ProviderUnavailable),
        ("timeout_before_commit", ProviderTimeout),
        ("reject", ProviderRejected),
    ],
)
def test_deploy_faults_before_commit_commit_nothing(
    deploy: DeployTarget, fault: str, raised: type[Exception]
) -> None:
    """Faults before commit raise and leave the revision, history and keys untouched."""
    deploy.inject("deploy", fault)  # type: ignore[arg-type]
    with pytest.raises(raised):
        deploy.deploy(PROD, "app:2", expected_revision=1, idempotency_key="d1")
    assert deploy.observe(PROD)["revision"] == 1
    assert deploy.history(PROD) == []
    assert deploy.get_deployment_by_idempotency_key("d1") is None
    assert deploy.deploy(PROD, "app:2", expected_revision=1, idempotency_key="d1")["revision"] == 2


# -- several objects and processes on one file -------------------------------------------------


def test_cas_lets_exactly_one_of_many_racing_writers_win(tmp_path: Path) -> None:
    """Threads on several objects deploying on one observed revision: exactly one succeeds."""
    path = tmp_path / "deploy.db"
    targets = [DeployTarget(path) for _ in range(4)]
    seen = targets[0].observe(PROD)["revision"]
    outcomes: list[str] = []
    lock = threading.Lock()

    def writer(target: DeployTarget, n: int) -> None:
        try:
            target.deploy(PROD, f"app:{n}", expected_revision=seen)
            outcome = "ok"
        except RevisionConflict:
            outcome = "conflict"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=writer, args=(t, n)) for n, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["conflict", "conflict", "conflict", "ok"]
    assert targets[1].observe(PROD)["revision"] == 2
    assert targets[2].overwrites(PROD) == 0
    for target in targets:
        target.close()


def test_another_process_sees_and_makes_writes_on_the_same_files(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A subprocess sees our refund and deploy, and its own writes are visible to us."""
    payments_path, deploy_path = tmp_path / "payments.db", tmp_path / "deploy.db"
    with (
        PaymentsProvider(payments_path, clock=clock) as payments,
        DeployTarget(deploy_path, clock=clock) as deploy,
    ):
        payments.create_refund("pay_1", 500, idempotency_key="k1")
        deploy.seed(PROD, "app:1")
        seen = deploy.observe(PROD)
        # The child's first call is a replay; the rule lets it through and hits the second.
        payments.inject("create_refund", "lose_response", after=1)
        child = textwrap.dedent(
            """
            import sys
            from effectflow.testing.providers import (
                DeployTarget, PaymentsProvider, ProviderTimeout,
            )

            # The parent's fake clock, so the parent's key is still remembered.
            payments = PaymentsProvider(sys.argv[1], clock=lambda: float(sys.argv[3]))
            assert payments.create_refund("pay_1", 500, idempotency_key="k1")["replayed"]
            try:
                payments.create_refund("pay_2", 700, idempotency_key="k2")
            except ProviderTimeout:
                pass
            else:
                raise SystemExit("the injected fault did not reach this process")
            deploy = DeployTarget(sys.argv[2])
            assert deploy.observe("deployment/prod")["image"] == "app:1"
            deploy.concurrent_deploy("deployment/prod", "theirs:1")
            """
        )
        result = subprocess.run(
            [sys.executable, "-c", child, str(payments_path), str(deploy_path), str(clock())],
            env=_child_env(),
            capture_output=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr.decode()
        assert [r["payment_id"] for r in payments.refunds()] == ["pay_1", "pay_2"]
        assert payments.get_refund_by_idempotency_key("k2") is not None
        with pytest.raises(RevisionConflict):
            deploy.deploy(PROD, "app:2", if_match=seen["etag"])
        assert [d["writer"] for d in deploy.history(PROD)] == ["other"]
