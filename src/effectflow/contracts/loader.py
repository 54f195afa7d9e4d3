"""Contracts written in YAML, in the seed's ``side_effect_contract:`` / ``workflow_step:`` shape.

A contract file is checked in three passes, and every problem of every pass is reported at once,
each naming the file, the line and the dotted field
(``side_effect_contract.idempotency.retention``):

1. YAML: the text is composed into nodes, which remember their lines, and then into plain data.
   PyYAML silently keeps the last of two equal keys; a contract must not depend on which one a
   reader notices, so a repeated key is a problem here.
2. The published JSON Schema (``schema.json``, draft 2020-12). It is the one source of truth for
   field names, types and enums: editors and other tools validate against the same file.
3. What a schema cannot say: a required completion state that is not among the states, a
   compensation deadline without a compensation, a step whose declared effect disagrees with its
   tool's contract, two contracts for the same tool or step.

A file with any problem yields nothing: a partial set would let a run start with a contract
silently missing, which is exactly the guess contracts exist to prevent.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import os
import pathlib
import string
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

import jsonschema
import yaml

from effectflow import errors
from effectflow.contracts import registry
from effectflow.contracts import tool as tool_mod
from effectflow.contracts import workflow as workflow_mod

P = ParamSpec("P")
R = TypeVar("R")

#: Where the published JSON Schema of a contract file lives (shipped as package data).
SCHEMA_PATH = pathlib.Path(__file__).with_name("schema.json")

_TOOL = "side_effect_contract"
_STEP = "workflow_step"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
#: ``$defs`` whose description is a noun phrase, so "expected <description>" reads well.
_NOUN_DEFS = ("duration", "tool_ref", "tool_name", "identifier", "name")
_TYPE_NAMES = {
    "string": "a string",
    "number": "a number",
    "integer": "a whole number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}

_Path = tuple[object, ...]
#: More values than any contract file needs; beyond it a document is refused unread.
_MAX_VALUES = 20_000


@functools.cache
def _published_schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return loaded


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_published_schema())


def schema() -> dict[str, Any]:
    """The published JSON Schema of one document of a contract file (a fresh copy to modify)."""
    return copy.deepcopy(_published_schema())


@dataclasses.dataclass(frozen=True)
class ContractSet:
    """The contracts of one valid file, ready to attach to functions and workflows."""

    #: Tool contracts by ``name@version``.
    tools: dict[str, tool_mod.ToolContract] = dataclasses.field(default_factory=dict)
    #: Step contracts by (workflow, step_id); workflow None = any workflow with that step.
    steps: dict[tuple[str | None, str], workflow_mod.StepContract] = dataclasses.field(
        default_factory=dict
    )

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
    documents = _read_documents(text, filename, problems)
    entries: list[_Entry] = []
    seen_item = False
    for document in documents:
        seen_item = seen_item or document.data is not None
        entries.extend(_validate_document(document, filename, problems))
    if not seen_item and not problems:
        problems.append(
            errors.ContractProblem(
                filename, 1, "<file>", f"holds no contracts; write a {_TOOL}: or {_STEP}: item"
            )
        )
    _check_entries(entries, problems)
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


# -- pass 1: YAML, with the line of every node --------------------------------------------------


class _Lines:
    """1-based lines of one document's nodes, by path (mapping keys and list indices)."""

    def __init__(self) -> None:
        #: Line of the key (or list item) that introduces the node at a path.
        self.keys: dict[_Path, int] = {}
        #: Line where the node's value starts (used for the document root).
        self.values: dict[_Path, int] = {}

    def at(self, path: _Path) -> int:
        """The line of ``path``'s key, else of its value, else of its nearest recorded parent.

        Parents stand in for values that have no node of their own: keys merged in with ``<<``,
        or the inside of an alias.
        """
        for end in range(len(path), -1, -1):
            prefix = path[:end]
            line = self.keys.get(prefix) or self.values.get(prefix)
            if line is not None:
                return line
        return 1


@dataclasses.dataclass(frozen=True)
class _Document:
    data: Any
    lines: _Lines


def _read_documents(
    text: str, filename: str, problems: list[errors.ContractProblem]
) -> list[_Document]:
    """Every document up to the first YAML error, which becomes a problem with its line."""
    documents: list[_Document] = []
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                break
            if _expanded_size(node, {}, set()) > _MAX_VALUES:
                message = (
                    f"the document expands to more than {_MAX_VALUES} values through aliases; "
                    "write the contracts out"
                )
                problems.append(
                    errors.ContractProblem(filename, node.start_mark.line + 1, "<yaml>", message)
                )
                continue
            lines = _Lines()
            # Index before constructing: construction flattens ``<<`` merges into the nodes,
            # which would make merged keys look like duplicates.
            _index(loader, node, (), None, lines, _Walk(filename, problems))
            documents.append(_Document(loader.construct_document(node), lines))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = f"YAML syntax: {exc.problem or exc.context}"
        if exc.problem and exc.context and exc.context_mark is not None:
            message += f" ({exc.context} on line {exc.context_mark.line + 1})"
        line = mark.line + 1 if mark is not None else 1
        problems.append(errors.ContractProblem(filename, line, "<yaml>", message))
    except RecursionError:
        message = "nested too deeply to read; contract files need only a few levels"
        problems.append(errors.ContractProblem(filename, 1, "<yaml>", message))
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        problems.append(errors.ContractProblem(filename, line, "<yaml>", f"YAML: {exc.reason}"))
    finally:
        if loader is not None:
            loader.dispose()
    return documents


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """How many values the node becomes once aliases are expanded, without expanding them.

    A few aliases can stand for millions of values ("billion laughs"); validating those would
    take minutes, as every schema error message prints its value.
    """
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        return 1  # a recursive alias: Python keeps it as one shared object
    open_nodes.add(id(node))
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    total = 1 + sum(_expanded_size(child, sizes, open_nodes) for child in children)
    open_nodes.discard(id(node))
    sizes[id(node)] = total
    return total


@dataclasses.dataclass
class _Walk:
    filename: str
    problems: list[errors.ContractProblem]
    #: Nodes already indexed: an alias is not walked again (no blow-up, no endless recursion).
    visited: set[int] = dataclasses.field(default_factory=set)


def _index(
    loader: yaml.SafeLoader,
    node: yaml.Node,
    path: _Path,
    key_line: int | None,
    lines: _Lines,
    walk: _Walk,
) -> None:
    if key_line is not None:
        lines.keys[path] = key_line
    lines.values[path] = node.start_mark.line + 1
    if id(node) in walk.visited:
        return
    walk.visited.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for position, item in enumerate(node.value):
            _index(loader, item, (*path, position), item.start_mark.line + 1, lines, walk)
    elif isinstance(node, yaml.MappingNode):
        first_line: dict[object, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = _key_of(loader, key_node)
            line = key_node.start_mark.line + 1
            if key in first_line:
                walk.problems.append(
                    errors.ContractProblem(
                        walk.filename,
                        line,
                        _dotted((*path, key)),
                        f"given twice (first on line {first_line[key]}); keep one",
                    )
                )
            # The data keeps the last value, so the last key's line is the one to point at.
            first_line.setdefault(key, line)
            _index(loader, value_node, (*path, key), line, lines, walk)


def _key_of(loader: yaml.SafeLoader, node: yaml.Node) -> object:
    """The key as the constructed data holds it (``1:`` is the int 1), so schema paths match."""
    if isinstance(node, yaml.ScalarNode) and node.tag == _STR_TAG:
        return node.value
    try:
        key: object = loader.construct_object(node)
        hash(key)
    except (yaml.YAMLError, ValueError, TypeError):
        return node.value
    return key


def _dotted(path: _Path) -> str:
    """``side_effect_contract.completion.states[1]``; list indices of a top-level list dropped."""
    if path and isinstance(path[0], int):
        path = path[1:]
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<item>"


# -- pass 2: the published schema -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One schema-valid item, with what is needed to point at its fields."""

    filename: str
    kind: str
    body: dict[str, Any]
    lines: _Lines
    base: _Path
    #: Paths where the schema found a problem (the field itself, or a missing or unknown key).
    broken: frozenset[_Path]

    def sound(self, *fields: str) -> bool:
        """Whether the schema found nothing wrong at, above or inside ``fields``."""
        target = (*self.base, *fields)
        return not any(
            target[: len(bad)] == bad or bad[: len(target)] == target for bad in self.broken
        )

    def line(self, *fields: str) -> int:
        return self.lines.at((*self.base, *fields))

    def field(self, *fields: str) -> str:
        return ".".join((self.kind, *fields))

    def problem(self, fields: tuple[str, ...], message: str) -> errors.ContractProblem:
        return errors.ContractProblem(
            self.filename, self.line(*fields), self.field(*fields), message
        )

    def get(self, *fields: str) -> Any:
        value: Any = self.body
        for name in fields:
            if not isinstance(value, dict):
                return None
            value = value.get(name)
        return value


def _validate_document(
    document: _Document, filename: str, problems: list[errors.ContractProblem]
) -> list[_Entry]:
    """Schema problems of one document, and an entry for each item shaped like a contract.

    Items with schema problems still become entries: pass 3 checks the fields the schema found
    sound, so one run reports as much as it can.
    """
    if document.data is None:
        return []
    found = list(_validator().iter_errors(document.data))
    extra_keys = {tuple(e.absolute_path) for e in found if e.validator == "additionalProperties"}
    broken: set[_Path] = set()
    for error in found:
        if (
            error.validator in ("minProperties", "maxProperties")
            and tuple(error.absolute_path) in extra_keys
        ):
            continue  # the unknown key is the problem to report, not the count it causes
        for path, problem in _problems_of(error, document.lines, filename):
            broken.add(path)
            problems.append(problem)
    is_list = isinstance(document.data, list)
    items = document.data if is_list else [document.data]
    entries = []
    for position, item in enumerate(items):
        if not isinstance(item, dict) or len(item) != 1:
            continue
        ((kind, body),) = item.items()
        if kind in (_TOOL, _STEP) and isinstance(body, dict):
            base = (position, kind) if is_list else (kind,)
            entries.append(_Entry(filename, kind, body, document.lines, base, frozenset(broken)))
    return entries


def _problems_of(
    error: jsonschema.ValidationError, lines: _Lines, filename: str
) -> list[tuple[_Path, errors.ContractProblem]]:
    """One schema error as problems that say where, which field, and what to write instead."""
    path: _Path = tuple(error.absolute_path)
    schema_here = error.schema if isinstance(error.schema, dict) else {}
    value = error.instance
    expected = error.validator_value
    listed: list[Any] = list(expected) if isinstance(expected, list) else [expected]

    def problem(at: _Path, message: str) -> tuple[_Path, errors.ContractProblem]:
        return at, errors.ContractProblem(filename, lines.at(at), _dotted(at), message)

    if error.validator == "required":
        missing = [name for name in listed if f"{name!r} is a" in error.message]
        name = missing[0] if missing else "?"
        # Reported at the line of the mapping that lacks the field: the field has no line.
        at = (*path, name)
        message = "missing required field"
        return [(at, errors.ContractProblem(filename, lines.at(path), _dotted(at), message))]
    if error.validator == "additionalProperties" and isinstance(value, dict):
        allowed = list(schema_here.get("properties", {}))
        return [
            problem(
                (*path, key),
                f"unknown field{_did_you_mean(str(key), allowed, lead='; ')}"
                f" (allowed: {', '.join(allowed)})",
            )
            for key in value
            if key not in allowed
        ]
    if error.validator in ("minProperties", "maxProperties"):
        return [
            problem(
                path,
                f"an item holds exactly one of {_TOOL} or {_STEP}; "
                "start another item (`- ` or `---`) for each contract",
            )
        ]
    if error.validator == "enum":
        options = [str(option) for option in listed]
        return [
            problem(
                path,
                f"{_show(value)} is not one of: {', '.join(options)}"
                f"{_did_you_mean(str(value), options, lead='; ')}",
            )
        ]
    noun = _noun_of(schema_here)
    if noun is not None and error.validator in ("type", "pattern", "minLength", "minimum"):
        return [problem(path, f"expected {noun}, got {_show(value)}")]
    if error.validator == "type":
        names = [_TYPE_NAMES.get(str(t), str(t)) for t in listed]
        return [problem(path, f"expected {' or '.join(names)}, got {_show(value)}")]
    return [problem(path, error.message)]


def _noun_of(schema_here: dict[str, Any]) -> str | None:
    definitions = _published_schema()["$defs"]
    for name in _NOUN_DEFS:
        if schema_here == definitions[name]:
            description: str = definitions[name]["description"]
            return description
    return None


def _did_you_mean(word: str, options: Iterable[str], *, lead: str) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f"{lead}did you mean {close[0]!r}?" if close else ""


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


# -- pass 3: what the schema cannot say ----------------------------------------------------------


def _check_entries(entries: list[_Entry], problems: list[errors.ContractProblem]) -> None:
    """Contradictions inside one contract, between a step and its tool, and duplicates.

    Each check reads only fields the schema found sound, so it never trips over a wrong type.
    """
    tools: dict[str, _Entry] = {}
    steps: dict[str, list[_Entry]] = {}
    for entry in entries:
        if entry.kind != _TOOL:
            continue
        problems.extend(_check_tool(entry))
        if not entry.sound("tool"):
            continue
        first = tools.setdefault(entry.body["tool"], entry)
        if first is not entry:
            problems.append(
                entry.problem(
                    ("tool",),
                    f"a {_TOOL} for {first.body['tool']} is already on line {first.line()}; "
                    "keep one",
                )
            )
    for entry in entries:
        if entry.kind != _STEP:
            continue
        problems.extend(_check_step(entry))
        if entry.sound("step_id") and entry.sound("workflow"):
            problems.extend(_check_duplicate_step(entry, steps))
        if entry.sound("tool") and "tool" in entry.body and entry.body["tool"] in tools:
            problems.extend(_check_step_against_tool(entry, tools[entry.body["tool"]]))


def _check_tool(entry: _Entry) -> list[errors.ContractProblem]:
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


def _check_step(entry: _Entry) -> list[errors.ContractProblem]:
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
    entry: _Entry, seen: dict[str, list[_Entry]]
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


def _check_step_against_tool(step: _Entry, tool: _Entry) -> list[errors.ContractProblem]:
    """A step restates its tool's effect for readers; a restatement that disagrees misleads them,
    and the runtime follows the tool's contract, so the two must agree."""
    found = []
    where = f"the {_TOOL} for {tool.body['tool']} (line {tool.line()})"

    def disagree(fields: tuple[str, ...], mine: object, declared: object) -> None:
        found.append(
            step.problem(
                fields,
                f"{_show(mine)} disagrees with {where}, which says {_show(declared)}; "
                "the runtime follows the tool's contract, so make them agree",
            )
        )

    effect = step.get("effect") if step.sound("effect") else None
    if effect is not None:
        declared_class = tool.get("effect_class")
        if "class" in effect and tool.sound("effect_class") and effect["class"] != declared_class:
            disagree(("effect", "class"), effect["class"], declared_class)
        declared_reversible = tool.get("reversible")
        if (
            "reversible" in effect
            and declared_reversible is not None
            and tool.sound("reversible")
            and effect["reversible"] != declared_reversible
        ):
            disagree(("effect", "reversible"), effect["reversible"], declared_reversible)
        declared_idempotency = (
            "supported" if tool.get("idempotency", "supported") else "unsupported"
        )
        if (
            "idempotency" in effect
            and tool.sound("idempotency")
            and effect["idempotency"] != declared_idempotency
        ):
            disagree(("effect", "idempotency"), effect["idempotency"], declared_idempotency)
    lookup = step.get("confirmation", "tool")
    if lookup is not None and step.sound("confirmation") and tool.sound("confirmation"):
        declared_lookup = tool.get("confirmation", "lookup_tool")
        if declared_lookup is None:
            found.append(
                step.problem(
                    ("confirmation", "tool"),
                    f"{where} names no confirmation.lookup_tool, so the runtime cannot confirm "
                    "through it; add it there or remove it here",
                )
            )
        elif not _same_tool(lookup, declared_lookup):
            disagree(("confirmation", "tool"), lookup, declared_lookup)
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


# -- building the contracts ----------------------------------------------------------------------


class _Blamed(Exception):
    """A constructor refused a value; carries the problem pointing at the field responsible."""

    def __init__(self, problem: errors.ContractProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


T = TypeVar("T")


def _attempt(entry: _Entry, fields: tuple[str, ...], make: Callable[[], T]) -> T:
    try:
        return make()
    except errors.ContractError as exc:
        raise _Blamed(entry.problem(fields, exc.message)) from None


def _build(entries: list[_Entry], problems: list[errors.ContractProblem]) -> ContractSet:
    contracts = ContractSet()
    for entry in entries:
        try:
            if entry.kind == _TOOL:
                made = _tool_contract(entry)
                contracts.tools.setdefault(made.ref, made)
            else:
                key = (entry.body.get("workflow"), entry.body["step_id"])
                contracts.steps.setdefault(key, _step_contract(entry))
        except _Blamed as blamed:
            problems.append(blamed.problem)
    return contracts


def _tool_contract(entry: _Entry) -> tool_mod.ToolContract:
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
        )
    retry = tool_mod.RetryPolicy()
    if "retry" in body:
        retry = _attempt(entry, ("retry",), lambda: tool_mod.RetryPolicy(**body["retry"]))
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
        retry=retry,
        external_system=body.get("external_system"),
        target=body.get("target"),
        record_request_digest=audit.get("record_request_digest", True),
        record_response_digest=audit.get("record_response_digest", True),
    )
    _attempt(entry, (), contract.validate)
    return contract


def _step_contract(entry: _Entry) -> workflow_mod.StepContract:
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
    )
