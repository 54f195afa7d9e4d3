"""The ledger's SQL, as named statements: one file per dialect, ``queries/<dialect>.sql``.

Every statement the stores run lives there under a name, so a reviewer reads the ledger's SQL in one
place, and a test holds the two dialects to the same set of names (``tests/conformance/
test_queries.py``) and every statement to its indexes (``test_query_plans.py``). The format, after
procrastinate's ``queries.sql``::

    -- name: get_run
    -- The run's row, by id.
    SELECT * FROM runs WHERE run_id = ?;

The comment lines after the name say why the statement is what it is. A name followed by
``(<dialect> only)`` is that dialect's own statement (PostgreSQL's shard locks, SQLite's confirmed
shard move); every other name is in both files. Each dialect writes its own placeholders (``?`` and
``%s``). A few statements have slots in braces for what only the call knows: ``{where}`` (a
listing's filter terms, built from column names by ``sql_core.filters``), ``{assignments}`` (the
run columns a batch changes), ``{marks}`` (one placeholder per value of a list).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from importlib import resources

#: The dialects that have a file.
DIALECTS = ("sqlite", "postgres")

_HEADER = re.compile(r"--\s*name:\s*(?P<name>[a-z][a-z0-9_]*)(?:\s*\((?P<only>[a-z]+) only\))?\s*$")


@dataclasses.dataclass(frozen=True)
class Query:
    """One named statement of a dialect's file."""

    #: What the code calls it by.
    name: str
    #: The statement, without its final semicolon.
    sql: str
    #: The comment under its name: why it is written so.
    doc: str
    #: The one dialect that has it (None: both do).
    only: str | None
    #: Where it starts in its file (1-based line), for messages.
    line: int


class QueryFileError(ValueError):
    """A dialect's query file breaks the format (raised when the ledger module is imported)."""


def parse(text: str, source: str) -> dict[str, Query]:
    """The named statements of one file's text (``source`` names it in errors)."""
    found: dict[str, Query] = {}
    current: dict[str, object] | None = None
    body: list[str] = []
    doc: list[str] = []

    def close() -> None:
        if current is None:
            return
        sql = "\n".join(body).strip().removesuffix(";").strip()
        name = str(current["name"])
        if not sql:
            raise QueryFileError(f"{source}:{current['line']}: query {name!r} has no statement")
        if ";" in sql:
            raise QueryFileError(
                f"{source}:{current['line']}: query {name!r} holds more than one statement"
            )
        only = current["only"]
        found[name] = Query(
            name, sql, " ".join(doc), None if only is None else str(only), int(str(current["line"]))
        )

    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        header = _HEADER.match(stripped)
        if header:
            close()
            name = header["name"]
            if name in found or (current is not None and current["name"] == name):
                raise QueryFileError(f"{source}:{number}: query {name!r} is defined twice")
            current = {"name": name, "only": header["only"], "line": number}
            body, doc = [], []
        elif stripped.startswith("--"):
            if current is not None and not body:
                doc.append(stripped.removeprefix("--").strip())
        elif stripped:
            if current is None:
                raise QueryFileError(f"{source}:{number}: a statement before any '-- name:' line")
            body.append(line)
    close()
    return found


@functools.cache
def load(dialect: str) -> dict[str, Query]:
    """A dialect's named statements (read once from the package)."""
    if dialect not in DIALECTS:
        raise ValueError(f"no query file for dialect {dialect!r}; there are {DIALECTS}")
    name = f"{dialect}.sql"
    text = resources.files("effectflow.ledger").joinpath("queries", name).read_text("utf-8")
    found = parse(text, f"ledger/queries/{name}")
    foreign = sorted(q.name for q in found.values() if q.only not in (None, dialect))
    if foreign:
        raise QueryFileError(f"ledger/queries/{name}: {foreign} are marked for another dialect")
    return found


def statements(dialect: str) -> dict[str, str]:
    """A dialect's statements by name: what a store runs."""
    return {name: query.sql for name, query in load(dialect).items()}
