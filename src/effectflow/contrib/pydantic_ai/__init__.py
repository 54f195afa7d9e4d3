"""Pydantic AI: effectflow's write path under an ``Agent``'s tool calls
(``pip install 'effectflow[pydantic-ai]'``; with ``'effectflow[pydantic-ai,dbos]'`` under Pydantic
AI's DBOS durability too).

One import, one line::

    from effectflow.contrib.pydantic_ai import Effectflow

    agent = Agent(model, capabilities=[Effectflow(rt, tools=[send_email])],
                  output_type=[str, DeferredToolRequests])

``Effectflow`` is a capability that contributes the ``ef.tool``s as a function toolset whose tool
functions make the guarded call themselves, so the call runs wherever a durable engine runs a
function tool (docs/integrations/pydantic_ai.md says why that, and not a capability hook or an
outer wrapper toolset). What needs a person comes back as Pydantic AI's deferred tools
(``ApprovalRequired``); ``answer`` turns the person's decisions into the ``DeferredToolResults``
that resume the run.
"""

try:
    import pydantic_ai as _pydantic_ai  # noqa: F401  (fails early, naming the extra)
except ImportError as _missing:  # pragma: no cover - the extra is installed wherever tests run
    raise ImportError(
        "effectflow.contrib.pydantic_ai needs Pydantic AI: pip install 'effectflow[pydantic-ai]'"
    ) from _missing

from effectflow.contrib.pydantic_ai.capability import (
    ALREADY_DONE,
    CANCELLED,
    DECLINED,
    TOOLSET_ID,
    Effectflow,
    conversation_call_ids,
    scope_of,
)
from effectflow.contrib.pydantic_ai.decisions import PAYLOAD_MARK, answer

__all__ = [
    "ALREADY_DONE",
    "CANCELLED",
    "DECLINED",
    "PAYLOAD_MARK",
    "TOOLSET_ID",
    "Effectflow",
    "answer",
    "conversation_call_ids",
    "scope_of",
]
