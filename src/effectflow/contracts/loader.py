"""Contracts written in YAML, in the seed's ``side_effect_contract:`` / ``workflow_step:`` shape.

A contract file is checked in three passes, and every problem of every pass is reported at once,
each naming the file, the line and the dotted field
(``side_effect_contract.idempotency.retention``):

1. YAML (``_yaml_lines``): the text is composed into nodes, which remember their lines, and then
   into plain data. PyYAML silently keeps the last of two equal keys; a contract must not depend
   on which one a reader notices, so a repeated key is a problem here.
2. The published JSON Schema (``schema.json``, draft 2020-12; ``_schema_errors``). It is the one
   source of truth for field names, types and enums: editors and other tools validate against
   the same file.
3. What a schema cannot say (``_semantic_checks``): a required completion state that is not among
   the states, a compensation deadline without a compensation, a step whose declared effect
   disagrees with its tool's contract, two contracts for the same tool or step.

A file with any problem yields nothing: a partial set would let a run start with a contract
silently missing, which is exactly the guess contracts exist to prevent.

This module keeps the public surface and builds the contract objects from a clean file.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
import pathlib
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from effectflow import errors
from effectflow.contracts import _schema_errors, _semantic_checks, _yaml_lines, redaction, registry
from effectflow.contracts import tool as tool_mod
from effectflow.contracts import workflow as workflow_mod

P = ParamSpec("P")
R = TypeVar("R")

#: Where the published JSON Schema of a contract file lives (shipped as package data).
SCHEMA_PATH = _schema_errors.SCHEMA_PATH


def schema() -> dict[str, Any]:
    """The published JSON Schema of one document of a contract file (a fresh copy to modify)."""
    return copy.deepcopy(_schema_errors.published_schema())


@dataclasses.dataclass(frozen=True)
class ContractSet:
    """The contracts of one valid file, ready to attach to functions and workflows."""

    #: Tool contracts by ``name@version``.
    tools: dict[str, tool_mod.ToolContract] = dataclasses.field(default_factory=dict)
    #: Step contracts by (workflow, step_id); workflow None = any workflow with that step.
    steps: dict[tuple[str | None, str], workflow_mod.StepContract] = dataclasses.field(
        default_factory=dict
    )
    #: Where each tool's redaction rule is written (``file:line``), by ``name@version``: a path
    #: naming no parameter is found when a function is decorated, and reported there.
    redact_at: dict[str, str] = dataclasses.field(default_factory=dict)

    def contract(self, ref: str) -> tool_mod.ToolContract:
        """The tool contract for ``name@version``, or for a bare name loaded in one version only.

        Raises:
            errors.ContractError: when the set has no such contract, or the bare name is ambiguous.
        """
        found = self.tools.get(ref)
        if found is not None:
            return found
        if "@" not in ref:
            versions = [c for c in self.tools.values() if c.name == ref]
            if len(versions) == 1:
                return versions[0]
            if versions:
                raise errors.ContractError(
                    f"tool {ref!r} has contracts in several versions "
                    f"({sorted(c.ref for c in versions)}); name one as name@version"
                )
        raise errors.ContractError(
            f"no side_effect_contract for tool {ref!r} was loaded (loaded: {sorted(self.tools)})"
        )

    def tool(
        self, ref: str, *, register: bool = True
    ) -> Callable[[Callable[P, R]], tool_mod.Tool[P, R]]:
        """Decorate a function as the tool ``ref`` with its loaded contract (the YAML twin of
        ``@ef.tool``), registering it like ``@ef.tool`` does so recovery can find it by name.

        Raises:
            errors.ContractError: at once for an unknown ``ref``; at decoration when the function
                cannot honour the contract (an idempotent tool without its key parameter).
        """
        contract = self.contract(ref)

        def decorate(fn: Callable[P, R]) -> tool_mod.Tool[P, R]:
            if contract.redact is not None:
                try:
                    redaction.check_parameters(contract.redact, inspect.signature(fn), contract.ref)
                except errors.ContractError as exc:
                    where = self.redact_at.get(contract.ref, "<contracts>")
                    raise errors.ContractError(
                        f"{where}: side_effect_contract.redact: {exc.message}"
                    ) from None
            made = tool_mod.Tool(fn, contract)
            if register:
                registry.DEFAULT.add_tool(made)
            return made

        return decorate

    def steps_for(self, workflow: str) -> list[workflow_mod.StepContract]:
        """The step contracts of ``workflow``: its own and those that name no workflow."""
        return [step for (name, _), step in self.steps.items() if name in (None, workflow)]


def load_contracts(path: str | os.PathLike[str]) -> ContractSet:
    """Load and validate one contract file.

    Raises:
        errors.ContractFileError: listing every problem (file, line, field); nothing is returned.
        OSError: when the file cannot be read (``FileNotFoundError`` for a missing one).
    """
    filename = os.fspath(path)
    raw = pathlib.Path(filename).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        problem = errors.ContractProblem(filename, line, "<file>", "not UTF-8 text; save as UTF-8")
        raise _file_error(filename, [problem]) from None
    return parse_contracts(text, filename=filename)


def parse_contracts(text: str, *, filename: str = "<string>") -> ContractSet:
    """Validate contract text and build its contracts; ``filename`` only labels problems.

    Raises:
        errors.ContractFileError: listing every problem sorted by line; nothing is returned.
    """
    problems: list[errors.ContractProblem] = []
    documents = _yaml_lines.read_documents(text, filename, problems)
    entries: list[_yaml_lines.Entry] = []
    seen_item = False
    for document in documents:
        seen_item = seen_item or document.data is not None
        entries.extend(_schema_errors.validate_document(document, filename, problems))
    if not seen_item and not problems:
        problems.append(
            errors.ContractProblem(
                filename,
                1,
                "<file>",
                f"holds no contracts; write a {_schema_errors.TOOL}: or {_schema_errors.STEP}: item",
            )
        )
    _semantic_checks.check_entries(entries, problems)
    if problems:
        raise _file_error(filename, problems)
    # The constructors re-check what pass 3 checked; building only a clean file keeps one
    # mistake from being reported twice, once by each.
    contracts = _build(entries, problems)
    if problems:
        raise _file_error(filename, problems)
    return contracts


def _file_error(filename: str, problems: list[errors.ContractProblem]) -> errors.ContractFileError:
    problems = sorted(problems, key=lambda p: (p.line, p.field))
    listing = "".join(f"\n  {problem}" for problem in problems)
    return errors.ContractFileError(f"{filename}: {len(problems)} problem(s){listing}", problems)


# -- building the contracts ----------------------------------------------------------------------


class _Blamed(Exception):
    """A constructor refused a value; carries the problem pointing at the field responsible."""

    def __init__(self, problem: errors.ContractProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


T = TypeVar("T")


def _attempt(entry: _yaml_lines.Entry, fields: tuple[str, ...], make: Callable[[], T]) -> T:
    try:
        return make()
    except errors.ContractError as exc:
        raise _Blamed(entry.problem(fields, exc.message)) from None


def _build(entries: list[_yaml_lines.Entry], problems: list[errors.ContractProblem]) -> ContractSet:
    contracts = ContractSet()
    for entry in entries:
        try:
            if entry.kind == _schema_errors.TOOL:
                made = _tool_contract(entry)
                contracts.tools.setdefault(made.ref, made)
                if made.redact is not None:
                    at = entry.line("redact")
                    contracts.redact_at.setdefault(made.ref, f"{entry.filename}:{at}")
            else:
                key = (entry.body.get("workflow"), entry.body["step_id"])
                contracts.steps.setdefault(key, _step_contract(entry))
        except _Blamed as blamed:
            problems.append(blamed.problem)
    return contracts


def _tool_contract(entry: _yaml_lines.Entry) -> tool_mod.ToolContract:
    body = entry.body
    name, version = body["tool"].split("@", 1)
    idempotency = tool_mod.Idempotency()
    if "idempotency" in body:
        idempotency = _attempt(
            entry, ("idempotency",), lambda: tool_mod.Idempotency(**body["idempotency"])
        )
    completion = None
    if "completion" in body:
        spec = dict(body["completion"])
        spec.setdefault("required", spec["states"][0])
        completion = _attempt(entry, ("completion",), lambda: tool_mod.Completion(**spec))
    recovery = body.get("recovery", {})
    compensation = None
    if "compensation_tool" in recovery:
        compensation = tool_mod.Compensation(
            tool=recovery["compensation_tool"],
            deadline=recovery.get("compensation_deadline"),
            automatic=recovery.get("compensation_automatic", False),
            param=recovery.get("compensation_param"),
        )
    retry = tool_mod.RetryPolicy()
    if "retry" in body:
        retry = _attempt(entry, ("retry",), lambda: tool_mod.RetryPolicy(**body["retry"]))
    redact = None
    if "redact" in body:
        redact = _attempt(entry, ("redact",), lambda: redaction.Redact.of(body["redact"]))
    audit = body.get("audit", {})
    contract = tool_mod.ToolContract(
        name=name,
        version=version,
        effect=tool_mod.EffectClass(body["effect_class"]),
        commit=tool_mod.CommitSemantics(body.get("commit_semantics", "remote_atomic")),
        reversible=body.get("reversible"),
        idempotency=idempotency,
        confirm=entry.get("confirmation", "lookup_tool"),
        effect_id=entry.get("confirmation", "external_effect_id_field"),
        completion=completion,
        compensation=compensation,
        timeout=body.get("timeout"),
        settles_within=body.get("settles_within"),
        each_call_new=body.get("each_call_new", False),
        retry=retry,
        external_system=body.get("external_system"),
        target=body.get("target"),
        record_request_digest=audit.get("record_request_digest", True),
        record_response_digest=audit.get("record_response_digest", True),
        approval=entry.get("approval", "required"),
        cancel=recovery.get("cancel_tool"),
        redact=redact,
    )
    _attempt(entry, (), contract.validate)
    return contract


def _step_contract(entry: _yaml_lines.Entry) -> workflow_mod.StepContract:
    body = entry.body
    recovery = body.get("recovery", {})
    compensation = body.get("compensation", {})
    return workflow_mod.StepContract(
        step_id=body["step_id"],
        tool=body.get("tool"),
        logical_operation_id=body.get("logical_operation_id"),
        required_state=entry.get("completion_semantics", "required_state"),
        evidence=entry.get("completion_semantics", "evidence"),
        when_confirmed=workflow_mod.WhenConfirmed(
            recovery.get("when_confirmed", workflow_mod.WhenConfirmed.SKIP_AND_CONTINUE)
        ),
        when_not_committed=workflow_mod.WhenNotCommitted(
            recovery.get(
                "when_not_committed", workflow_mod.WhenNotCommitted.RETRY_WITH_ORIGINAL_KEY
            )
        ),
        when_unknown=workflow_mod.WhenUnknown(
            recovery.get("when_unknown", workflow_mod.WhenUnknown.RECONCILE_THEN_PAUSE)
        ),
        compensation_trigger=compensation.get("trigger"),
        compensation_automatic=compensation.get("automatic"),
        compensation_strategy=compensation.get("strategy"),
        observe=entry.get("precondition", "observe"),
        max_reobserve=body.get("precondition", {}).get("max_reobserve", 3),
    )
