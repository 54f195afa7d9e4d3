"""The checks a JSON Schema cannot express, run on items the schema has already looked at.

A schema checks each field on its own; it cannot say that a required completion state must be
among the states, that a compensation deadline needs a compensation, that a step's restated
effect must agree with its tool's contract, or that two contracts claim the same tool or step.
Each check reads only fields the schema found sound, so a wrong type is reported once, by the
schema, and never trips a check here.
"""

from __future__ import annotations

import string

from effectflow import errors
from effectflow.contracts import _schema_errors, _yaml_lines
from effectflow.contracts import tool as tool_mod


def check_entries(entries: list[_yaml_lines.Entry], problems: list[errors.ContractProblem]) -> None:
    """Contradictions inside one contract, between a step and its tool, and duplicates.

    Each check reads only fields the schema found sound, so it never trips over a wrong type.
    """
    tools: dict[str, _yaml_lines.Entry] = {}
    steps: dict[str, list[_yaml_lines.Entry]] = {}
    for entry in entries:
        if entry.kind != _schema_errors.TOOL:
            continue
        problems.extend(_check_tool(entry))
        if not entry.sound("tool"):
            continue
        first = tools.setdefault(entry.body["tool"], entry)
        if first is not entry:
            problems.append(
                entry.problem(
                    ("tool",),
                    f"a {_schema_errors.TOOL} for {first.body['tool']} is already on line "
                    f"{first.line()}; keep one",
                )
            )
    for entry in entries:
        if entry.kind != _schema_errors.STEP:
            continue
        problems.extend(_check_step(entry))
        if entry.sound("step_id") and entry.sound("workflow"):
            problems.extend(_check_duplicate_step(entry, steps))
        if entry.sound("tool") and "tool" in entry.body and entry.body["tool"] in tools:
            problems.extend(_check_step_against_tool(entry, tools[entry.body["tool"]]))


def _check_tool(entry: _yaml_lines.Entry) -> list[errors.ContractProblem]:
    found = []
    effect = None
    if entry.sound("effect_class") and "effect_class" in entry.body:
        effect = tool_mod.EffectClass(entry.body["effect_class"])
    completion = entry.get("completion")
    if completion is not None and entry.sound("completion"):
        if effect is not None and not effect.writes:
            found.append(
                entry.problem(
                    ("completion",),
                    f"a {effect} tool has no effect to complete; remove completion "
                    "or declare a write effect_class",
                )
            )
        states = completion["states"]
        required = completion.get("required", states[0])
        if required not in states:
            found.append(
                entry.problem(
                    ("completion", "required"),
                    f"{required!r} is not one of the states {states}; name one of them",
                )
            )
    recovery = entry.get("recovery")
    if recovery is None or not entry.sound("recovery"):
        return found
    if "compensation_tool" in recovery:
        if effect is not None and not effect.writes:
            found.append(
                entry.problem(
                    ("recovery", "compensation_tool"),
                    f"a {effect} tool has no effect to compensate; remove it "
                    "or declare a write effect_class",
                )
            )
    else:
        found.extend(
            entry.problem(
                ("recovery", name), "names no recovery.compensation_tool; add one or remove this"
            )
            for name in ("compensation_deadline", "compensation_automatic")
            if name in recovery
        )
    commit = entry.body.get("commit_semantics", tool_mod.CommitSemantics.REMOTE_ATOMIC.value)
    if (
        recovery.get("rollback") == "supported"
        and entry.sound("commit_semantics")
        and commit != tool_mod.CommitSemantics.LOCAL_TRANSACTION
    ):
        found.append(
            entry.problem(
                ("recovery", "rollback"),
                "only a local_transaction tool commits inside the step's transaction and can "
                f"roll back, and this one is {commit}; write rollback: unsupported",
            )
        )
    return found


def _check_step(entry: _yaml_lines.Entry) -> list[errors.ContractProblem]:
    found = []
    template = entry.get("logical_operation_id")
    if template is not None and entry.sound("logical_operation_id"):
        try:
            names = [
                name for _, name, _, _ in string.Formatter().parse(template) if name is not None
            ]
        except ValueError as exc:
            found.append(
                entry.problem(
                    ("logical_operation_id",),
                    f"not a valid template ({exc}); write run inputs in braces, "
                    "e.g. op_case_{case_id}_email",
                )
            )
        else:
            if any(not name.isidentifier() for name in names):
                found.append(
                    entry.problem(
                        ("logical_operation_id",),
                        "each {placeholder} must name a run input, e.g. op_case_{case_id}_email",
                    )
                )
    if (
        entry.sound("compensation")
        and entry.get("compensation", "automatic") is True
        and not entry.get("compensation", "trigger")
    ):
        found.append(
            entry.problem(
                ("compensation", "automatic"),
                "automatic compensation needs a business trigger (e.g. goal_abandoned); "
                "add compensation.trigger",
            )
        )
    return found


def _check_duplicate_step(
    entry: _yaml_lines.Entry, seen: dict[str, list[_yaml_lines.Entry]]
) -> list[errors.ContractProblem]:
    """A step contract for no workflow applies to every workflow, so it clashes with any other
    contract for the same step id: ``steps_for`` would hand the workflow both."""
    step_id = entry.body["step_id"]
    workflow = entry.body.get("workflow")
    found = []
    for other in seen.setdefault(step_id, []):
        theirs = other.body.get("workflow")
        if workflow is None or theirs is None or workflow == theirs:
            where = f"workflow {theirs}" if theirs else "any workflow"
            found.append(
                entry.problem(
                    ("step_id",),
                    f"step {step_id!r} already has a contract for {where} on line "
                    f"{other.line()}; a workflow takes one contract per step, keep one",
                )
            )
            break
    seen[step_id].append(entry)
    return found


def _check_step_against_tool(
    step: _yaml_lines.Entry, tool: _yaml_lines.Entry
) -> list[errors.ContractProblem]:
    """A step restates its tool's effect for readers; a restatement that disagrees misleads them,
    and the runtime follows the tool's contract, so the two must agree."""
    where = f"the {_schema_errors.TOOL} for {tool.body['tool']} (line {tool.line()})"
    return [
        *_effect_disagreements(step, tool, where),
        *_confirmation_problems(step, tool, where),
        *_completion_problems(step, tool, where),
    ]


def _disagree(
    step: _yaml_lines.Entry, where: str, fields: tuple[str, ...], mine: object, declared: object
) -> errors.ContractProblem:
    return step.problem(
        fields,
        f"{_schema_errors.show(mine)} disagrees with {where}, "
        f"which says {_schema_errors.show(declared)}; "
        "the runtime follows the tool's contract, so make them agree",
    )


def _effect_disagreements(
    step: _yaml_lines.Entry, tool: _yaml_lines.Entry, where: str
) -> list[errors.ContractProblem]:
    """The step's ``effect`` (class, reversible, idempotency) against the tool's declaration."""
    found: list[errors.ContractProblem] = []
    effect = step.get("effect") if step.sound("effect") else None
    if effect is None:
        return found
    declared_class = tool.get("effect_class")
    if "class" in effect and tool.sound("effect_class") and effect["class"] != declared_class:
        found.append(_disagree(step, where, ("effect", "class"), effect["class"], declared_class))
    declared_reversible = tool.get("reversible")
    if (
        "reversible" in effect
        and declared_reversible is not None
        and tool.sound("reversible")
        and effect["reversible"] != declared_reversible
    ):
        found.append(
            _disagree(
                step, where, ("effect", "reversible"), effect["reversible"], declared_reversible
            )
        )
    declared_idempotency = "supported" if tool.get("idempotency", "supported") else "unsupported"
    if (
        "idempotency" in effect
        and tool.sound("idempotency")
        and effect["idempotency"] != declared_idempotency
    ):
        found.append(
            _disagree(
                step, where, ("effect", "idempotency"), effect["idempotency"], declared_idempotency
            )
        )
    return found


def _confirmation_problems(
    step: _yaml_lines.Entry, tool: _yaml_lines.Entry, where: str
) -> list[errors.ContractProblem]:
    """The step's confirmation tool must be the lookup its tool names."""
    lookup = step.get("confirmation", "tool")
    if lookup is None or not step.sound("confirmation") or not tool.sound("confirmation"):
        return []
    declared_lookup = tool.get("confirmation", "lookup_tool")
    if declared_lookup is None:
        return [
            step.problem(
                ("confirmation", "tool"),
                f"{where} names no confirmation.lookup_tool, so the runtime cannot confirm "
                "through it; add it there or remove it here",
            )
        ]
    if not _same_tool(lookup, declared_lookup):
        return [_disagree(step, where, ("confirmation", "tool"), lookup, declared_lookup)]
    return []


def _completion_problems(
    step: _yaml_lines.Entry, tool: _yaml_lines.Entry, where: str
) -> list[errors.ContractProblem]:
    """A required state the tool never reports, or automatic compensation with nothing to run."""
    found = []
    required_state = step.get("completion_semantics", "required_state")
    states = tool.get("completion", "states")
    if (
        required_state is not None
        and states is not None
        and step.sound("completion_semantics")
        and tool.sound("completion")
        and required_state not in states
    ):
        found.append(
            step.problem(
                ("completion_semantics", "required_state"),
                f"{required_state!r} is not one of the states {states} that {where} reports, "
                "so the step could never complete; name one of them",
            )
        )
    if (
        step.sound("compensation")
        and step.get("compensation", "automatic") is True
        and tool.sound("recovery")
        and not tool.get("recovery", "compensation_tool")
    ):
        found.append(
            step.problem(
                ("compensation", "automatic"), f"{where} names no recovery.compensation_tool to run"
            )
        )
    return found


def _same_tool(one: str, other: str) -> bool:
    """Equal refs, or equal names when either leaves the version out."""
    if "@" in one and "@" in other:
        return one == other
    return one.split("@", 1)[0] == other.split("@", 1)[0]
