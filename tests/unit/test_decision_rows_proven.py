"""Every row of the decision table (docs/decision-table.md) and every rule of cancel
(docs/concepts.md#cancel) names the tests that prove it end to end, reading the ledger and the
provider. This test keeps that index honest: a new row without a proof, or a proof that was renamed
away, fails here.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from effectflow.policies import decision

RUNTIME = "tests.integration.test_runtime"
STOP = "tests.integration.test_compensation_and_cancel"
MOVE = "tests.integration.test_preconditions_completion_local"
CRASH = "tests.crash.test_write_path_crashes"
COMP_CRASH = "tests.crash.test_compensation_crash"
LOCAL = "tests.crash.test_local_transaction_crash"
LANDING = "tests.integration.test_not_found_is_proof"

#: Decision-table row id -> tests that drive a run into that row against a real provider.
ROW_PROOFS: dict[str, list[str]] = {
    "confirmed": [
        f"{RUNTIME}::test_resume_skips_confirmed_steps_and_returns_their_recorded_output"
    ],
    "not_started": [f"{CRASH}::test_crash_in_window_then_recover"],  # the before_intent windows
    "in_doubt_pure_read": [f"{CRASH}::test_crash_in_window_then_recover"],
    "in_doubt_idempotent": [
        f"{RUNTIME}::test_key_within_retention_is_retried_with_the_original_key",
        f"{COMP_CRASH}::test_crash_in_compensation_then_recover",
    ],
    "in_doubt_lookup": [f"{RUNTIME}::test_reconcile_settles_a_paused_run_through_its_lookup"],
    "in_doubt_budget_spent": [
        f"{RUNTIME}::test_reconcile_settles_a_paused_run_through_its_lookup",
        f"{STOP}::test_reconcile_moves_a_cancelled_run_on_once_its_lookup_answers",
    ],
    "in_doubt_may_still_land": [
        f"{LANDING}::test_a_call_that_never_answers_goes_to_a_person_not_to_a_second_call",
        f"{LANDING}::test_after_a_sigkill_on_the_wire_with_no_bound_a_person_decides",
    ],
    "in_doubt_no_lookup": [
        f"{RUNTIME}::test_plain_exception_after_sending_asks_a_person",
        f"{RUNTIME}::test_key_past_retention_is_not_blindly_retried",
    ],
    "in_doubt_policy_pause": [
        f"{RUNTIME}::test_resolve_not_committed_then_resume_retries_with_the_original_key"
    ],
    "rejected": [
        f"{RUNTIME}::test_rejected_call_fails_the_step_without_retry",
        f"{STOP}::test_a_failed_compensation_goes_to_a_person",
    ],
    "not_committed_retry": [
        f"{RUNTIME}::test_not_committed_is_retried_up_to_the_budget_then_the_run_fails"
    ],
    "not_committed_policy_pause": [
        f"{RUNTIME}::test_step_policy_pause_on_not_committed_asks_a_person"
    ],
    "not_committed_policy_fail": [
        f"{RUNTIME}::test_step_policy_fail_on_not_committed_fails_the_run"
    ],
    "budget_spent": [
        f"{RUNTIME}::test_not_committed_is_retried_up_to_the_budget_then_the_run_fails"
    ],
    "conflict": [
        f"{MOVE}::test_a_conflict_reobserves_and_writes_on_the_new_revision",
        f"{MOVE}::test_a_conflict_without_an_observation_step_pauses_for_a_person",
        f"{MOVE}::test_conflicts_past_the_reobserve_budget_pause",
    ],
    "awaiting_completion": [f"{MOVE}::test_a_step_requiring_delivery_waits_for_it"],
    "completion_deadline": [f"{MOVE}::test_a_missed_completion_deadline_asks_a_person"],
    "abandoned_compensable": [
        f"{STOP}::test_abandoned_goal_compensates_as_a_new_effect_with_a_new_approval",
        f"{STOP}::test_compensations_run_newest_first",
        f"{COMP_CRASH}::test_crash_in_compensation_then_recover",
    ],
    "abandoned_irreversible": [
        f"{STOP}::test_an_irreversible_effect_stays_confirmed_when_the_goal_is_abandoned"
    ],
    "technical_failure": [
        f"{STOP}::test_a_technical_failure_after_two_confirmed_effects_compensates_nothing"
    ],
    "local_rollback": [
        f"{LOCAL}::test_exception_in_local_transaction_rolls_back_write_and_checkpoint",
        f"{LOCAL}::test_crash_in_local_transaction_leaves_neither_then_recovery_runs_it_once",
    ],
}

#: docs/concepts.md#cancel, rule by rule -> the tests that prove it.
CANCEL_PROOFS: dict[str, list[str]] = {
    "stop steps not started": [
        f"{STOP}::test_cancel_while_a_step_is_pending_stops_it",
        f"{STOP}::test_cancel_while_a_call_is_in_flight_lets_it_land_and_stops_before_the_next_step",
        f"{STOP}::test_a_cancel_learnt_with_the_intent_stops_the_call_before_it_is_sent",
    ],
    "cancel in-flight calls whose tool declares a cancel operation": [
        f"{STOP}::test_cancel_stops_a_call_in_flight_through_the_tools_cancel_operation",
        f"{STOP}::test_cancel_while_awaiting_completion_stops_the_call_through_its_cancel_operation",
    ],
    "else let them land and classify them": [
        f"{STOP}::test_cancel_while_a_call_is_in_flight_lets_it_land_and_stops_before_the_next_step"
    ],
    "never mark confirmed effects undone": [
        f"{STOP}::test_cancel_after_a_confirmed_effect_never_marks_it_undone"
    ],
    "queue unknowns for confirmation": [
        f"{STOP}::test_cancel_with_an_intent_recorded_queues_it_and_settles_after_reconciliation",
        f"{STOP}::test_cancel_with_an_unknown_outcome_moves_on_when_it_is_confirmed",
        f"{STOP}::test_reconcile_moves_a_cancelled_run_on_once_its_lookup_answers",
    ],
    "then apply the compensation policy": [
        f"{STOP}::test_cancel_applies_the_compensation_policy_when_the_trigger_says_so"
    ],
    "end states and the inventory": [
        f"{STOP}::test_cancel_while_a_step_is_pending_stops_it",
        f"{STOP}::test_cancel_after_a_confirmed_effect_never_marks_it_undone",
        f"{STOP}::test_cancel_with_an_intent_recorded_queues_it_and_settles_after_reconciliation",
        f"{STOP}::test_cancel_of_a_finished_run_changes_nothing",
    ],
}


ROOT = pathlib.Path(__file__).resolve().parents[2]


def _exists(node: str) -> bool:
    """Whether the test function exists (read with ast: importing would re-register its tools)."""
    module_name, _, function = node.partition("::")
    path = ROOT / (module_name.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text("utf-8"))
    return any(isinstance(n, ast.FunctionDef) and n.name == function for n in tree.body)


def test_every_row_of_the_decision_table_has_a_proof() -> None:
    rows = {decision.decide(situation, facts).row for _, situation, facts in decision.EXAMPLES}
    assert rows == set(ROW_PROOFS), "a decision row without an end-to-end test (or a stale entry)"


@pytest.mark.parametrize(
    "node",
    sorted({n for proofs in (ROW_PROOFS, CANCEL_PROOFS) for ns in proofs.values() for n in ns}),
)
def test_each_named_proof_exists(node: str) -> None:
    assert _exists(node), f"{node} is named as a proof but does not exist"
