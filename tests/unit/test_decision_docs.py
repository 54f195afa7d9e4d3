"""The printed decision table is the function's behaviour."""

from __future__ import annotations

from pathlib import Path

from effectflow.policies import decision

DOC = Path(__file__).resolve().parents[2] / "docs" / "decision-table.md"


def test_docs_table_is_generated_from_decide() -> None:
    """docs/decision-table.md contains exactly what `decide` answers for every example row."""
    assert decision.render_markdown() in DOC.read_text(encoding="utf-8")


def test_every_row_of_the_function_has_an_example() -> None:
    """Each distinct row id `decide` can return appears in the examples (so in the docs)."""
    rows = {decision.decide(s, f).row for _, s, f in decision.EXAMPLES}
    assert len(rows) == len(decision.EXAMPLES)
