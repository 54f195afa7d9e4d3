"""Contracts written in YAML: the published schema, problems that name file/line/field, the CLI."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import textwrap
from typing import Any

import jsonschema
import pytest

from effectflow import errors
from effectflow.contracts import loader, registry
from effectflow.contracts import tool as tool_mod
from effectflow.contracts import workflow as workflow_mod

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "contracts"


def parse(text: str, filename: str = "c.yaml") -> loader.ContractSet:
    return loader.parse_contracts(textwrap.dedent(text), filename=filename)


def problems_of(text: str, filename: str = "c.yaml") -> list[errors.ContractProblem]:
    with pytest.raises(errors.ContractFileError) as caught:
        parse(text, filename)
    return caught.value.problems


def effectflow_cli() -> str:
    beside = pathlib.Path(sys.executable).parent / "effectflow"
    found = str(beside) if beside.exists() else shutil.which("effectflow")
    assert found, "the effectflow console script is not installed"
    return found


def run_cli(*args: str | pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [effectflow_cli(), "contracts", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# -- valid files ----------------------------------------------------------------------------------


def test_customer_case_example_loads_into_tool_and_step_contracts() -> None:
    """The customer-case example becomes Tool/StepContract objects holding the YAML's values."""
    contracts = loader.load_contracts(EXAMPLES / "customer_case.yaml")

    send = contracts.tools["send_email@4"]
    assert (send.name, send.version) == ("send_email", "4")
    assert send.effect is tool_mod.EffectClass.EXTERNAL_WRITE
    assert send.commit is tool_mod.CommitSemantics.ASYNC_ACCEPTED
    assert send.reversible is False
    assert send.idempotency.supported
    assert send.idempotency.retention_seconds == 24 * 3600
    assert send.idempotency.tagged_as == "Idempotency-Key header"
    assert send.confirm == "get_email_status"
    assert send.effect_id == "provider_message_id"
    assert send.completion is not None
    assert send.completion.states == ("accepted", "sent", "delivered")
    assert send.completion.required == "accepted"
    assert send.retry.max_attempts == 3
    assert send.timeout == 10
    assert contracts.tools["create_crm_task@1"].effect is tool_mod.EffectClass.IDEMPOTENT_WRITE
    notify = contracts.tools["notify_owner@1"]
    assert not notify.idempotency.supported
    assert notify.idempotency.key_param == "client_tag"
    assert notify.confirm == "find_owner_notification"

    assert [step.step_id for step in contracts.steps_for("customer_case")] == [
        "draft_email",
        "send_case_email",
        "create_crm_followup",
        "notify_owner",
    ]
    step = contracts.steps[("customer_case", "send_case_email")]
    assert step.tool == "send_email@4"
    assert step.operation_id_for({"case_id": "92"}) == "op_case_92_email"
    assert (step.required_state, step.evidence) == ("accepted", "provider_message_id")
    assert step.when_not_committed is workflow_mod.WhenNotCommitted.RETRY_WITH_ORIGINAL_KEY
    assert step.when_unknown is workflow_mod.WhenUnknown.RECONCILE_THEN_PAUSE
    assert step.compensation_automatic is False
    assert step.compensation_trigger == "goal_abandoned"
    assert step.compensation_strategy == "send_correction_if_business_required"


def test_refund_example_carries_the_seeds_contract() -> None:
    """The seed's create_refund@3.1 contract loads with its compensation, retry and audit fields."""
    contracts = loader.load_contracts(EXAMPLES / "refund.yaml")

    refund = contracts.tools["create_refund@3.1"]
    assert refund.effect is tool_mod.EffectClass.FINANCIAL_WRITE
    assert refund.commit is tool_mod.CommitSemantics.REMOTE_ATOMIC
    assert refund.idempotency.same_key_different_payload == "reject"
    assert refund.effect_id == "refund_id"
    assert refund.confirm == "get_refund_by_idempotency_key"
    assert refund.compensation == tool_mod.Compensation(
        tool="cancel_refund@1", deadline="PT10M", automatic=False
    )
    assert refund.external_system == "payments-prod"
    assert refund.target == "payment_id"
    assert refund.record_request_digest
    assert refund.record_response_digest
    assert list(contracts.steps) == [("refund", "create_refund")]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_each_example_file_validates(path: pathlib.Path) -> None:
    """Every shipped example is a valid contract file with at least one tool and one step."""
    contracts = loader.load_contracts(path)
    assert contracts.tools
    assert contracts.steps


def test_seed_workflow_step_loads_verbatim() -> None:
    """The seed's own workflow_step block, provider_accepted and all, is a valid contract."""
    contracts = parse(
        """\
        workflow_step:
          step_id: send_case_email
          tool: send_email@4
          logical_operation_id: op_case_92_email
          completion_semantics:
            required_state: provider_accepted
            evidence: provider_message_id
          effect:
            class: external_write
            reversible: false
            idempotency: supported
          confirmation:
            tool: get_email_status
            lookup_by: [provider_message_id, idempotency_key]
          recovery:
            when_confirmed: skip_and_continue
            when_not_committed: retry_with_original_key
            when_unknown: reconcile_then_pause
          compensation:
            automatic: false
            strategy: send_correction_if_business_required
        """
    )
    step = contracts.steps[(None, "send_case_email")]
    assert step.required_state == "provider_accepted"
    assert contracts.steps_for("any_workflow") == [step]


def test_top_level_list_and_multiple_documents_both_load() -> None:
    """A file may hold a top-level list, several `---` documents, or both."""
    contracts = parse(
        """\
        - side_effect_contract: {tool: a@1, effect_class: read}
        - side_effect_contract: {tool: b@2, effect_class: pure}
        ---
        side_effect_contract: {tool: c@1, effect_class: idempotent_write, timeout: PT1M}
        ---
        """.replace("timeout: PT1M", "timeout: 60")
    )
    assert list(contracts.tools) == ["a@1", "b@2", "c@1"]


def test_durations_accept_iso_8601_and_seconds() -> None:
    """Retention and deadlines take ISO 8601 durations or plain numbers of seconds."""
    contracts = parse(
        """\
        side_effect_contract:
          tool: t@1
          effect_class: external_write
          idempotency: {supported: true, retention: 3600}
          completion: {states: [accepted, delivered], deadline: P1DT2H}
        """
    )
    contract = contracts.tools["t@1"]
    assert contract.idempotency.retention_seconds == 3600
    assert contract.completion is not None
    assert contract.completion.required == "accepted"  # the first state when not named


# -- problems: file, line, field ----------------------------------------------------------------


def test_yaml_syntax_error_reports_its_line() -> None:
    """A YAML syntax error is a problem on the line where the parser failed."""
    problems = problems_of(
        """\
        side_effect_contract:
          tool: send_email@4
          effect_class: [external_write
          timeout: 10
        """
    )
    assert len(problems) == 1
    assert problems[0].line == 4
    assert problems[0].field == "<yaml>"
    assert "YAML syntax" in problems[0].message


def test_misspelt_field_names_file_line_and_dotted_field() -> None:
    """`retension:` is reported at its line, with its dotted field and the likely intended name."""
    problems = problems_of(
        """\
        side_effect_contract:
          tool: create_refund@3.1
          effect_class: financial_write
          idempotency:
            supported: true
            retension: PT24H
        """,
        filename="refund.yaml",
    )
    assert [str(p) for p in problems] == [
        "refund.yaml:6: side_effect_contract.idempotency.retension: unknown field; "
        "did you mean 'retention'? (allowed: supported, key_scope, retention, "
        "same_key_different_payload, key_param, tagged_as)"
    ]


def test_wrong_enum_value_lists_the_choices() -> None:
    """An effect class outside the enum names the allowed values and the closest one."""
    (problem,) = problems_of(
        """\
        side_effect_contract:
          tool: create_refund@3.1
          effect_class: finance_write
        """
    )
    assert (problem.line, problem.field) == (3, "side_effect_contract.effect_class")
    assert "pure, read, idempotent_write, external_write, financial_write" in problem.message
    assert "did you mean 'financial_write'" in problem.message


def test_bad_duration_is_rejected_with_an_example() -> None:
    """A retention that is not an ISO 8601 duration or seconds is refused with what to write."""
    (problem,) = problems_of(
        """\
        side_effect_contract:
          tool: send_email@4
          effect_class: external_write
          idempotency: {supported: true, retention: 24 hours}
        """
    )
    assert (problem.line, problem.field) == (4, "side_effect_contract.idempotency.retention")
    assert "ISO 8601" in problem.message
    assert "PT24H" in problem.message


def test_missing_required_field_names_the_mappings_line() -> None:
    """A missing required field is reported at the line of the mapping that lacks it."""
    (problem,) = problems_of(
        """\
        # the refund tool
        side_effect_contract:
          tool: create_refund@3.1
          commit_semantics: remote_atomic
        """
    )
    assert (problem.line, problem.field) == (2, "side_effect_contract.effect_class")
    assert problem.message == "missing required field"


def test_tool_must_be_name_at_version() -> None:
    """`tool:` without a version is refused: the ledger records name@version."""
    (problem,) = problems_of("side_effect_contract: {tool: send_email, effect_class: read}\n")
    assert problem.field == "side_effect_contract.tool"
    assert "name@version" in problem.message


def test_completion_required_must_be_one_of_the_states() -> None:
    """A required completion state the provider never reports is refused at its line."""
    (problem,) = problems_of(
        """\
        side_effect_contract:
          tool: send_email@4
          effect_class: external_write
          completion:
            states: [accepted, sent]
            required: delivered
        """
    )
    assert (problem.line, problem.field) == (6, "side_effect_contract.completion.required")
    assert "'delivered' is not one of the states" in problem.message


def test_duplicate_tool_contract_is_refused() -> None:
    """Two contracts for the same name@version are refused, pointing at both lines."""
    (problem,) = problems_of(
        """\
        - side_effect_contract: {tool: send_email@4, effect_class: external_write}
        - side_effect_contract: {tool: get_email_status@1, effect_class: read}
        - side_effect_contract: {tool: send_email@4, effect_class: read}
        """
    )
    assert (problem.line, problem.field) == (3, "side_effect_contract.tool")
    assert "already on line 1" in problem.message


def test_duplicate_step_contract_is_refused() -> None:
    """A step contract for any workflow clashes with one for a named workflow and the same step."""
    (problem,) = problems_of(
        """\
        - workflow_step: {step_id: notify_owner}
        - workflow_step: {workflow: customer_case, step_id: notify_owner}
        - workflow_step: {workflow: other, step_id: draft_email}
        - workflow_step: {workflow: customer_case, step_id: draft_email}
        """
    )
    assert (problem.line, problem.field) == (2, "workflow_step.step_id")


def test_repeated_yaml_key_is_refused() -> None:
    """A key given twice in one mapping is a problem, not a silent last-one-wins."""
    (problem,) = problems_of(
        """\
        side_effect_contract:
          tool: send_email@4
          effect_class: external_write
          effect_class: read
        """
    )
    assert (problem.line, problem.field) == (4, "side_effect_contract.effect_class")
    assert "first on line 3" in problem.message


def test_step_effect_that_disagrees_with_its_tool_contract_is_refused() -> None:
    """A step restating its tool's effect class wrongly is refused when both are loaded."""
    problems = problems_of(
        """\
        - side_effect_contract:
            tool: send_email@4
            effect_class: external_write
            completion: {states: [accepted, sent, delivered]}
        - workflow_step:
            step_id: send_case_email
            tool: send_email@4
            completion_semantics: {required_state: provider_accepted}
            effect: {class: idempotent_write}
        """
    )
    assert [(p.line, p.field) for p in problems] == [
        (8, "workflow_step.completion_semantics.required_state"),
        (9, "workflow_step.effect.class"),
    ]
    assert "disagrees with the side_effect_contract for send_email@4 (line 1)" in (
        problems[1].message
    )


def test_item_with_both_kinds_or_an_unknown_kind_is_refused() -> None:
    """Each item holds exactly one of side_effect_contract or workflow_step."""
    problems = problems_of(
        """\
        - side_effect_contract: {tool: a@1, effect_class: read}
          workflow_step: {step_id: a}
        - side_effect_contrat: {tool: a@1, effect_class: read}
        """
    )
    assert [(p.line, p.field) for p in problems] == [
        (1, "<item>"),
        (3, "side_effect_contrat"),
    ]
    assert "did you mean 'side_effect_contract'" in problems[1].message


def test_several_problems_are_all_reported_in_line_order() -> None:
    """Schema and semantic problems across items are all reported, sorted by line."""
    problems = problems_of(
        """\
        - workflow_step:
            step_id: notify_owner
            recovery: {when_unknown: retry}
        - side_effect_contract:
            tool: send_email@4
            effect_class: external_write
            completion: {states: [accepted], required: delivered}
            timout: 10
        - side_effect_contract:
            effect_class: read
        """
    )
    assert [(p.line, p.field) for p in problems] == [
        (3, "workflow_step.recovery.when_unknown"),
        (7, "side_effect_contract.completion.required"),
        (8, "side_effect_contract.timout"),
        (9, "side_effect_contract.tool"),
    ]
    assert all(p.file == "c.yaml" for p in problems)


def test_nothing_is_returned_when_any_item_has_a_problem() -> None:
    """One bad item among good ones fails the whole file: no partial contract set."""
    text = (EXAMPLES / "customer_case.yaml").read_text(encoding="utf-8")
    bad = text + "\n- side_effect_contract: {tool: extra@1, effect_class: maybe}\n"
    result: loader.ContractSet | None = None
    with pytest.raises(errors.ContractFileError) as caught:
        result = loader.parse_contracts(bad, filename="customer_case.yaml")
    assert result is None
    assert str(caught.value).startswith("customer_case.yaml: 1 problem(s)")
    assert caught.value.code == "contract_file"


def test_empty_file_is_a_problem() -> None:
    """A file with no contracts is refused rather than silently loading nothing."""
    (problem,) = problems_of("# nothing here\n")
    assert (problem.line, problem.field) == (1, "<file>")


def test_file_that_is_not_utf8_is_a_problem(tmp_path: pathlib.Path) -> None:
    """Bytes that are not UTF-8 are a problem on their line, not a crash."""
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"side_effect_contract:\n  tool: caf\xe9@1\n")
    with pytest.raises(errors.ContractFileError) as caught:
        loader.load_contracts(path)
    (problem,) = caught.value.problems
    assert (problem.file, problem.line) == (str(path), 2)


# -- using a loaded set ---------------------------------------------------------------------------


def test_contract_set_tool_builds_and_registers_the_tool() -> None:
    """`contracts.tool(ref)` wraps a function with the loaded contract and registers it."""
    contracts = parse(
        """\
        side_effect_contract:
          tool: yaml_probe_write@2
          effect_class: external_write
          idempotency: {supported: true}
        """
    )

    @contracts.tool("yaml_probe_write@2")
    def probe(value: str, *, idempotency_key: str) -> dict[str, Any]:
        return {"value": value}

    assert probe.contract is contracts.tools["yaml_probe_write@2"]
    assert registry.DEFAULT.tool("yaml_probe_write@2") is probe
    assert probe("x", idempotency_key="k") == {"value": "x"}


def test_contract_set_tool_refuses_unknown_ref_and_missing_key_param() -> None:
    """An unknown ref fails at once; an idempotent contract needs the key parameter."""
    contracts = parse(
        "side_effect_contract: {tool: keyed@1, effect_class: external_write,"
        " idempotency: {supported: true}}\n"
    )
    with pytest.raises(errors.ContractError, match="no side_effect_contract"):
        contracts.tool("other@1")

    def no_key(value: str) -> None:
        del value

    with pytest.raises(errors.ContractError, match="idempotency_key"):
        contracts.tool("keyed", register=False)(no_key)


def test_steps_for_feeds_a_workflow() -> None:
    """`steps_for(name)` gives a workflow its own step contracts and the shared ones."""
    contracts = parse(
        """\
        - workflow_step: {workflow: customer_case, step_id: send_case_email}
        - workflow_step: {step_id: notify_owner, recovery: {when_unknown: pause}}
        - workflow_step: {workflow: refund, step_id: create_refund}
        """
    )

    @workflow_mod.workflow(
        "customer_case", steps=contracts.steps_for("customer_case"), register=False
    )
    def customer_case(ctx: object) -> None:
        del ctx

    assert list(customer_case.steps) == ["send_case_email", "notify_owner"]
    assert customer_case.steps["notify_owner"].when_unknown is workflow_mod.WhenUnknown.PAUSE


# -- the published schema -------------------------------------------------------------------------


def test_published_schema_is_a_valid_draft_2020_12_schema() -> None:
    """The shipped schema.json is itself a valid JSON Schema (draft 2020-12)."""
    published = loader.schema()
    jsonschema.Draft202012Validator.check_schema(published)
    assert published == json.loads(loader.SCHEMA_PATH.read_text(encoding="utf-8"))


def test_schema_enums_match_the_python_enums() -> None:
    """The schema's enums are exactly the values the Python contract classes accept."""
    defs = loader.schema()["$defs"]
    tool_props = defs["side_effect_contract"]["properties"]
    recovery = defs["workflow_step"]["properties"]["recovery"]["properties"]
    assert defs["effect_class"]["enum"] == [e.value for e in tool_mod.EffectClass]
    assert tool_props["commit_semantics"]["enum"] == [c.value for c in tool_mod.CommitSemantics]
    assert recovery["when_confirmed"]["enum"] == [w.value for w in workflow_mod.WhenConfirmed]
    assert recovery["when_not_committed"]["enum"] == [
        w.value for w in workflow_mod.WhenNotCommitted
    ]
    assert recovery["when_unknown"]["enum"] == [w.value for w in workflow_mod.WhenUnknown]


# -- the CLI, as a real process -------------------------------------------------------------------


def test_cli_check_passes_the_examples() -> None:
    """`effectflow contracts check` exits 0 and prints OK with counts for valid files."""
    done = run_cli("check", EXAMPLES / "customer_case.yaml", EXAMPLES / "refund.yaml")
    assert done.returncode == 0, done.stderr
    assert f"OK  {EXAMPLES / 'customer_case.yaml'}: 7 tool contracts, 4 step contracts" in (
        done.stdout
    )
    assert f"OK  {EXAMPLES / 'refund.yaml'}: 3 tool contracts, 1 step contracts" in done.stdout


def test_cli_check_reports_problems_as_file_line_field(tmp_path: pathlib.Path) -> None:
    """A bad file exits 1 and prints each problem as path:line: field: message on stderr."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "side_effect_contract:\n"
        "  tool: create_refund@3.1\n"
        "  effect_class: financial_write\n"
        "  idempotency: {supported: true, retension: PT24H}\n",
        encoding="utf-8",
    )
    done = run_cli("check", bad)
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"{bad}:4: side_effect_contract.idempotency.retension: unknown field"
    )
    assert "OK" not in done.stdout


def test_cli_check_missing_file_is_a_usage_error(tmp_path: pathlib.Path) -> None:
    """A file that does not exist exits 2 with a message naming it."""
    missing = tmp_path / "nope.yaml"
    done = run_cli("check", missing)
    assert done.returncode == 2
    assert f"{missing}: no such file" in done.stderr


def test_cli_check_json_is_machine_readable(tmp_path: pathlib.Path) -> None:
    """`--json` prints one parseable report with problems, tools and steps per file."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("side_effect_contract: {tool: x@1}\n", encoding="utf-8")
    done = run_cli("check", "--json", EXAMPLES / "refund.yaml", bad)
    assert done.returncode == 1
    report = json.loads(done.stdout)
    good, broken = report["files"]
    assert good["ok"] is True
    assert good["tools"] == [
        "create_refund@3.1",
        "get_refund_by_idempotency_key@1",
        "cancel_refund@1",
    ]
    assert good["steps"] == [{"workflow": "refund", "step_id": "create_refund"}]
    assert broken["ok"] is False
    assert broken["problems"] == [
        {
            "file": str(bad),
            "line": 1,
            "field": "side_effect_contract.effect_class",
            "message": "missing required field",
        }
    ]


def test_cli_schema_prints_the_published_schema() -> None:
    """`effectflow contracts schema` prints the same JSON Schema the loader validates against."""
    done = run_cli("schema")
    assert done.returncode == 0
    assert json.loads(done.stdout) == loader.schema()


def test_alias_bomb_is_refused_without_expanding_it() -> None:
    """A document that aliases expand to millions of values is refused quickly, unread."""
    rows = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for previous, name in zip("abcdefg", "bcdefgh", strict=True):
        rows.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    (problem,) = problems_of("\n".join(rows) + "\n")
    assert (problem.line, problem.field) == (1, "<yaml>")
    assert "aliases" in problem.message


def test_approval_cancel_tool_and_precondition_load_from_yaml() -> None:
    """The fields of approvals, cancel operations and preconditions have a YAML form too."""
    contracts = loader.parse_contracts(
        textwrap.dedent(
            """\
            side_effect_contract:
              tool: deploy@2
              effect_class: external_write
              approval: {required: true}
              recovery: {cancel_tool: abort_deploy, compensation_tool: rollback_deploy,
                         compensation_param: deployment_id, compensation_automatic: true}
            ---
            workflow_step:
              workflow: release
              step_id: deploy
              precondition: {observe: observe_prod, max_reobserve: 5}
              compensation: {trigger: cancelled}
            """
        ),
        filename="inline.yaml",
    )
    deploy = contracts.tools["deploy@2"]
    assert deploy.needs_approval
    assert deploy.cancel == "abort_deploy"
    assert deploy.compensation is not None
    assert deploy.compensation.param == "deployment_id"
    step = contracts.steps[("release", "deploy")]
    assert (step.observe, step.max_reobserve) == ("observe_prod", 5)
    assert step.triggers == frozenset({"cancelled"})


def test_an_unknown_compensation_trigger_is_refused_with_its_line() -> None:
    with pytest.raises(errors.ContractFileError) as caught:
        loader.parse_contracts(
            "workflow_step:\n  step_id: s\n  compensation: {trigger: on_failure}\n",
            filename="bad.yaml",
        )
    [problem] = caught.value.problems
    assert problem.line == 3
    assert "trigger" in problem.field


def test_settles_within_is_part_of_the_yaml_contract() -> None:
    """The bound on a provider's late commits is declared in YAML too: a duration or 'unbounded'."""
    contracts = parse(
        """\
        - side_effect_contract:
            tool: post@1
            effect_class: external_write
            settles_within: PT30S
        - side_effect_contract:
            tool: chat@1
            effect_class: external_write
            settles_within: unbounded
        """
    )
    assert contracts.tools["post@1"].settles_within_seconds == 30
    assert contracts.tools["chat@1"].settles_within == "unbounded"
    [problem] = problems_of(
        """\
        side_effect_contract:
          tool: post@1
          effect_class: external_write
          settles_within: later
        """
    )
    assert problem.line == 4
    assert "settles_within" in problem.field
