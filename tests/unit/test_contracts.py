"""Tool and workflow contracts refuse contradictions at declaration time, with errors that say
what to fix; registry misses name the import to add."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import effectflow as ef
from effectflow.contracts.registry import Registry


def declare(name: str, **contract: Any) -> ef.Tool[..., Any]:
    """Decorate a stub with ``contract`` (contracts are checked when the decorator is applied)."""

    def stub(*, idempotency_key: str = "") -> None: ...

    return ef.tool(name, register=False, **contract)(stub)


def test_unknown_effect_class_is_refused() -> None:
    """An effect class outside the five is refused, listing the valid ones."""
    with pytest.raises(ef.ContractError, match=r"effect 'teleport' is not one of \['pure'"):
        ef.tool("beam_up", effect="teleport", register=False)


def test_unknown_commit_semantics_is_refused() -> None:
    """Commit semantics outside the four are refused, listing the valid ones."""
    with pytest.raises(ef.ContractError, match=r"commit 'eventually' is not one of"):
        ef.tool("send", effect="external_write", commit="eventually", register=False)


def test_idempotency_without_key_parameter_is_refused() -> None:
    """A tool that declares idempotency must take the key, or the provider could never see it."""
    decorate = ef.tool(
        "send_email",
        effect="external_write",
        idempotency=ef.Idempotency(supported=True),
        register=False,
    )

    def send_email(to: str) -> dict[str, Any]:
        return {}

    with pytest.raises(ef.ContractError) as caught:
        decorate(send_email)
    assert "has no 'idempotency_key' parameter" in caught.value.message
    assert "add `*, idempotency_key: str`" in caught.value.message


def test_idempotency_with_custom_key_parameter_or_var_keywords_is_accepted() -> None:
    """The key may arrive through a named parameter of the contract's choosing, or **kwargs."""

    @ef.tool(
        "send_a",
        effect="external_write",
        idempotency=ef.Idempotency(supported=True, key_param="dedup_id"),
        register=False,
    )
    def send_a(to: str, *, dedup_id: str) -> None: ...

    @ef.tool(
        "send_b",
        effect="external_write",
        idempotency=ef.Idempotency(supported=True),
        register=False,
    )
    def send_b(to: str, **options: Any) -> None: ...

    assert send_a.takes_key
    assert send_b.takes_key


def test_completion_required_must_be_one_of_the_states() -> None:
    """A required completion state the provider never reports is refused."""
    with pytest.raises(ef.ContractError, match=r"'delivered' is not one of the states"):
        ef.Completion(states=["accepted", "sent"], required="delivered")


@pytest.mark.parametrize("effect", ["pure", "read"])
def test_compensation_on_a_non_write_tool_is_refused(effect: str) -> None:
    """A tool that changes nothing has nothing to compensate."""
    with pytest.raises(ef.ContractError, match=rf"a {effect} tool has no effect to compensation"):
        declare("summarize", effect=effect, compensation=ef.Compensation(tool="undo@1"))


def test_completion_on_a_pure_tool_is_refused() -> None:
    """Completion states only make sense for a write."""
    with pytest.raises(ef.ContractError, match="no effect to completion"):
        declare("summarize", effect="pure", completion=ef.Completion())


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"idempotency": ef.Idempotency(supported=True, retention="24 hours")}, "retention"),
        ({"idempotency": ef.Idempotency(supported=True, retention="P")}, "retention"),
        (
            {"compensation": ef.Compensation(tool="cancel@1", deadline="10 minutes")},
            "compensation.deadline",
        ),
    ],
    ids=["words", "empty_period", "compensation_deadline"],
)
def test_bad_iso_duration_is_refused(kwargs: dict[str, Any], field: str) -> None:
    """A duration that is not ISO 8601 is refused, naming the field and a correct example."""
    with pytest.raises(ef.ContractError) as caught:
        declare("send", effect="external_write", **kwargs)
    assert field in caught.value.message
    assert "write e.g. 'PT24H'" in caught.value.message


def test_iso_durations_parse() -> None:
    """Retention in ISO 8601 is read in seconds."""
    assert ef.Idempotency(retention="PT24H").retention_seconds == 86400
    assert ef.Idempotency(retention="P1DT30M").retention_seconds == 86400 + 1800
    assert ef.Idempotency(retention=90).retention_seconds == 90


def test_non_positive_timeout_is_refused() -> None:
    """A timeout must be positive seconds."""
    with pytest.raises(ef.ContractError, match="timeout must be positive"):
        declare("send", effect="external_write", timeout=0)


def test_tool_name_cannot_contain_a_version_separator() -> None:
    """``@`` separates name and version in the ledger, so a name cannot contain it."""
    with pytest.raises(ef.ContractError, match="without '@'"):
        declare("send@2", effect="read")


def test_retry_budget_must_allow_one_call() -> None:
    """A retry policy that allows no call at all is refused."""
    with pytest.raises(ef.ContractError, match="max_attempts must be at least 1"):
        ef.RetryPolicy(max_attempts=0)


def test_workflow_must_take_the_context() -> None:
    """A workflow function without a context parameter is refused."""
    with pytest.raises(ef.ContractError, match="must take the context"):
        ef.workflow("no_ctx", register=False)(lambda: None)


def test_workflow_refuses_two_contracts_for_one_step() -> None:
    """Two step contracts for one step id would contradict each other."""
    with pytest.raises(ef.ContractError, match="step 'send' has two contracts"):
        ef.workflow(
            "twice",
            steps=[ef.StepContract("send"), ef.StepContract("send")],
            register=False,
        )(lambda ctx: None)


def test_step_operation_template_names_missing_input() -> None:
    """A logical operation template naming an input the run lacks is a contract error."""
    step = ef.StepContract("send", logical_operation_id="op_case_{case_id}_email")
    assert step.operation_id_for({"case_id": "92"}) == "op_case_92_email"
    with pytest.raises(ef.ContractError, match="names 'case_id' which the run's input lacks"):
        step.operation_id_for({"order": "1"})


# -- registry ---------------------------------------------------------------------------------------


def test_unknown_tool_names_the_import_to_fix() -> None:
    """Looking up an unregistered tool says to import the module that defines it."""
    reg = Registry()

    @ef.tool("known", effect="read", register=False)
    def known() -> None: ...

    reg.add_tool(known)
    assert reg.tool("known") is known
    assert reg.tool("known@1") is known
    with pytest.raises(ef.ContractError) as caught:
        reg.tool("send_email@4")
    assert "unknown tool 'send_email@4'" in caught.value.message
    assert "import the module that defines it" in caught.value.message
    assert "known@1" in caught.value.message


def test_unknown_workflow_names_the_import_to_fix() -> None:
    """Looking up an unregistered workflow says to import its module before resuming."""
    with pytest.raises(ef.ContractError) as caught:
        Registry().workflow("customer_case")
    assert "unknown workflow 'customer_case'" in caught.value.message
    assert "import the module that defines it before resuming" in caught.value.message


def test_registry_refuses_another_function_under_the_same_ref() -> None:
    """Two different functions cannot claim one ``name@version``."""
    reg = Registry()

    @ef.tool("dup", effect="read", register=False)
    def first() -> None: ...

    @ef.tool("dup", effect="read", register=False)
    def second() -> None: ...

    reg.add_tool(first)
    reg.add_tool(first)  # a module re-import registers the same function again: fine
    with pytest.raises(ef.ContractError, match="already registered by"):
        reg.add_tool(second)


def test_resume_in_a_process_without_the_workflow_names_it(tmp_path: Path) -> None:
    """Resuming a run whose workflow is not imported fails with the workflow's name, not a KeyError."""

    @ef.workflow("contracts_test_unimported", register=False)
    def unimported(ctx: ef.Context) -> None: ...

    with ef.Runtime(f"sqlite:///{tmp_path}/l.db", registry=Registry()) as rt:
        run = rt.submit(unimported, run_id="r1")
        with pytest.raises(ef.ContractError, match="unknown workflow 'contracts_test_unimported'"):
            rt.resume(run.run_id)


# -- when "not found" is proof (docs/decision-table.md#when-not-found-is-proof) -------------------


@ef.tool("proof_lookup", effect="read", register=False)
def _lookup(*, idempotency_key: str) -> ef.Lookup:
    return ef.Lookup.not_committed()


@pytest.mark.parametrize("effect", ["external_write", "financial_write"])
def test_a_non_idempotent_write_with_a_lookup_must_say_when_not_found_is_proof(
    effect: str,
) -> None:
    """Neither a deadline parameter nor settles_within: refused at declaration, naming both fixes
    and the explicit opt-in for providers that give no bound."""
    with pytest.raises(ef.ContractError) as caught:
        declare("unbounded_post", effect=effect, confirm=_lookup)
    message = str(caught.value)
    assert "proof_lookup@1" in message
    assert "`deadline` parameter" in message
    assert "settles_within=<seconds" in message
    assert "settles_within='unbounded'" in message


def test_a_deadline_parameter_or_a_declared_bound_makes_not_found_proof() -> None:
    """Each of the two fixes is accepted, and so is the explicit 'unbounded'."""

    def with_deadline(*, idempotency_key: str, deadline: float) -> None: ...

    assert ef.tool("dl_post", effect="external_write", confirm=_lookup, register=False)(
        with_deadline
    ).takes_deadline
    bounded = declare("b_post", effect="external_write", confirm=_lookup, settles_within="PT30S")
    assert bounded.contract.settles_within_seconds == 30
    assert declare("n_post", effect="external_write", confirm=_lookup, settles_within=0)
    unbounded = declare(
        "u_post", effect="external_write", confirm=_lookup, settles_within="unbounded"
    )
    assert unbounded.contract.settles_within_seconds is None


def test_repeatable_writes_and_writes_without_a_lookup_need_no_bound() -> None:
    """A provider that honours the key (or deduplicates naturally) makes a retry safe; with no
    lookup, nothing can be disproved anyway (a person decides)."""
    assert declare(
        "key_post", effect="external_write", confirm=_lookup, idempotency=ef.Idempotency(True)
    )
    assert declare("upsert", effect="idempotent_write", confirm=_lookup)
    assert declare("plain_post", effect="external_write")


@pytest.mark.parametrize("bad", ["soon", -1, "P", True])
def test_a_bad_settles_within_is_refused(bad: Any) -> None:
    with pytest.raises(ef.ContractError, match="settles_within"):
        declare("bad_bound", effect="external_write", confirm=_lookup, settles_within=bad)
