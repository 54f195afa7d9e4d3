"""An ``ef.tool`` as a host offers it to a model: its description and its parameters' validator.

The parameters are ``agents.schemas.parameters_schema`` (the signature without the injected key,
``deadline``, ``precondition``, ``tx``). The description ends with what the contract means for a
model that has no ``check_effect`` tool (a host's agent): a repeat after a lost answer is not made
twice, a call after its result is a new request. ``agents.schemas.effect_note`` says it otherwise
on purpose: its model is told to ask ``check_effect``.
"""

from __future__ import annotations

import functools
import inspect
import json
from typing import Any

import jsonschema

from effectflow import errors
from effectflow.contracts.tool import EffectClass, Tool
from effectflow.contrib.agents import schemas


def checked(tool: object, who: str) -> Tool[..., Any]:
    """``tool``, once it is known to be an ``ef.tool``: a host's own tool offered in its place
    would run without a side-effect contract.

    Raises:
        errors.ContractError: it is not one (``who`` names the adapter's function refusing it).
    """
    if not isinstance(tool, Tool):
        raise errors.ContractError(
            f"{who}: {tool!r} is not a tool; decorate it with @ef.tool(...) so its side-effect "
            "contract is known"
        )
    return tool


def description(tool: Tool[..., Any]) -> str:
    """The tool's docstring, then what its contract means for the model, in its words."""
    doc = inspect.cleandoc(tool.fn.__doc__ or "").strip()
    note = effect_note(tool)
    return f"{doc}\n\n{note}" if doc else note


def effect_note(tool: Tool[..., Any]) -> str:
    """What the contract says about a call, for a model whose host guards every call."""
    contract = tool.contract
    if contract.effect is EffectClass.PURE:
        return "Effect: pure - changes nothing outside; safe to repeat."
    if contract.effect is EffectClass.READ:
        return "Effect: read - only observes; safe to repeat."
    reversible = "reversible" if contract.reversible else "irreversible"
    if contract.each_call_new:
        repeat = "every call is a new request"
    else:
        repeat = (
            "done once per request: a call repeated after a lost answer is not done twice; "
            "calling it again after its result is a new request"
        )
    note = f"Effect: {contract.effect.value}, {reversible} - {repeat}."
    if contract.needs_approval:
        note += " Each call waits for a person's approval."
    return note


@functools.lru_cache(maxsize=1024)
def tool_validator(tool: Tool[..., Any]) -> Any:
    """The validator of the arguments a model may pass to ``tool``, built once per tool:
    ``jsonschema.validate`` checks the schema itself on every call, most of an adapter's own
    cost (BENCHMARKS.md)."""
    schema = schemas.parameters_schema(tool)
    return jsonschema.validators.validator_for(schema)(schema)


@functools.lru_cache(maxsize=1024)
def schema_validator(schema_json: str) -> Any:
    """The validator of a schema the host holds (a user's own tool definition), built once per
    schema, given as its canonical JSON (a dict is not hashable)."""
    schema = json.loads(schema_json)
    return jsonschema.validators.validator_for(schema)(schema)
