"""What every host adapter says and does alike, written once (imports no host package).

The adapters (``langgraph``, ``pydantic_ai``, ``openai_agents``, ``dbos``, ``temporal``) differ in
how a host carries a tool call in and an answer out; around ``rt.guard`` they do the same things:

- :mod:`.decisions`: a person's decision about a call that waits, read from the host's answer
  (``{"approved": ...}``, ``{"committed": ...}``, ``{}``) into a typed record and recorded in the
  ledger; what the person is shown (the question, the template of an answer);
- :mod:`.answers`: what the model is told about a guarded call (``done``, ``already_done``,
  ``unknown``, ``declined``, ...), and whether an earlier answer showed the call's result;
- :mod:`.definitions`: an ``ef.tool`` as a host offers it to a model: its description, with what
  its contract means, and the validator of its parameters.

Where hosts differ on purpose (their wording of a refused decision, which errors a tool must
answer rather than raise), the difference is a parameter here, not a copy.
"""
