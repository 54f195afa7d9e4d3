"""JSON-Schema validation, and jsonschema's errors said clearly: the "what is wrong" concern.

The published schema (``schema.json``, draft 2020-12) is the one source of truth for field names,
types and enums: editors and other tools validate against the same file. jsonschema's own
messages are written for schema authors ("Additional properties are not allowed ..."); a contract
author needs the line, the dotted field and what to write instead, so each error is reworded here
into ``ContractProblem`` objects.
"""

from __future__ import annotations

import difflib
import functools
import json
import pathlib
from collections.abc import Iterable
from typing import Any

import jsonschema

from effectflow import errors
from effectflow.contracts import _yaml_lines

#: Where the published JSON Schema of a contract file lives (shipped as package data).
SCHEMA_PATH = pathlib.Path(__file__).with_name("schema.json")

#: The two kinds of item a contract file holds.
TOOL = "side_effect_contract"
STEP = "workflow_step"
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


@functools.cache
def published_schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return loaded


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(published_schema())


def validate_document(
    document: _yaml_lines.Document, filename: str, problems: list[errors.ContractProblem]
) -> list[_yaml_lines.Entry]:
    """Schema problems of one document, and an entry for each item shaped like a contract.

    Items with schema problems still become entries: pass 3 checks the fields the schema found
    sound, so one run reports as much as it can.
    """
    if document.data is None:
        return []
    found = list(_validator().iter_errors(document.data))
    extra_keys = {tuple(e.absolute_path) for e in found if e.validator == "additionalProperties"}
    broken: set[_yaml_lines.NodePath] = set()
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
        if kind in (TOOL, STEP) and isinstance(body, dict):
            base = (position, kind) if is_list else (kind,)
            entries.append(
                _yaml_lines.Entry(filename, kind, body, document.lines, base, frozenset(broken))
            )
    return entries


def _problems_of(
    error: jsonschema.ValidationError, lines: _yaml_lines.Lines, filename: str
) -> list[tuple[_yaml_lines.NodePath, errors.ContractProblem]]:
    """One schema error as problems that say where, which field, and what to write instead."""
    path: _yaml_lines.NodePath = tuple(error.absolute_path)
    schema_here = error.schema if isinstance(error.schema, dict) else {}
    value = error.instance
    expected = error.validator_value
    listed: list[Any] = list(expected) if isinstance(expected, list) else [expected]

    def problem(
        at: _yaml_lines.NodePath, message: str
    ) -> tuple[_yaml_lines.NodePath, errors.ContractProblem]:
        return at, errors.ContractProblem(filename, lines.at(at), _yaml_lines.dotted(at), message)

    if error.validator == "required":
        missing = [name for name in listed if f"{name!r} is a" in error.message]
        name = missing[0] if missing else "?"
        # Reported at the line of the mapping that lacks the field: the field has no line.
        at = (*path, name)
        message = "missing required field"
        return [
            (at, errors.ContractProblem(filename, lines.at(path), _yaml_lines.dotted(at), message))
        ]
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
                f"an item holds exactly one of {TOOL} or {STEP}; "
                "start another item (`- ` or `---`) for each contract",
            )
        ]
    if error.validator == "enum":
        options = [str(option) for option in listed]
        return [
            problem(
                path,
                f"{show(value)} is not one of: {', '.join(options)}"
                f"{_did_you_mean(str(value), options, lead='; ')}",
            )
        ]
    noun = _noun_of(schema_here)
    if noun is not None and error.validator in ("type", "pattern", "minLength", "minimum"):
        return [problem(path, f"expected {noun}, got {show(value)}")]
    if error.validator == "type":
        names = [_TYPE_NAMES.get(str(t), str(t)) for t in listed]
        return [problem(path, f"expected {' or '.join(names)}, got {show(value)}")]
    return [problem(path, error.message)]


def _noun_of(schema_here: dict[str, Any]) -> str | None:
    definitions = published_schema()["$defs"]
    for name in _NOUN_DEFS:
        if schema_here == definitions[name]:
            description: str = definitions[name]["description"]
            return description
    return None


def _did_you_mean(word: str, options: Iterable[str], *, lead: str) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f"{lead}did you mean {close[0]!r}?" if close else ""


def show(value: object) -> str:
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
