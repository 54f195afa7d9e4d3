"""The ledger's own transaction, lent to ``local_transaction`` tools.

A tool whose writes go to the ledger's database can commit them in the same transaction as its step
checkpoint: then there is no window in which the write happened but the ledger does not know it, and
a failure rolls both back. That is the only place effectflow uses the word "rollback".
"""

from __future__ import annotations

from typing import Any

from effectflow import errors

_TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE")


class LocalTransaction:
    """What a ``local_transaction`` tool receives as ``tx``: the ledger's open transaction.

    ``execute`` passes SQL straight to the backend's driver (SQLite: ``?`` placeholders; PostgreSQL:
    ``%s``). Statements that would end or split the transaction are refused, because the runtime
    commits the tool's writes together with the checkpoint.
    """

    def __init__(self, connection: Any, *, backend: str, paramstyle: str) -> None:
        self._connection = connection
        #: ``sqlite`` or ``postgresql``.
        self.backend = backend
        #: The DB-API placeholder style (``qmark`` for SQLite, ``format`` for psycopg).
        self.paramstyle = paramstyle

    def execute(self, sql: str, params: Any = ()) -> Any:
        """Run one statement in the transaction; returns the driver's cursor."""
        self._refuse_control(sql)
        return self._connection.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> Any:
        """Run one statement for many parameter rows."""
        self._refuse_control(sql)
        return self._connection.executemany(sql, rows)

    def _refuse_control(self, sql: str) -> None:
        head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if head in _TRANSACTION_CONTROL:
            raise errors.ContractError(
                f"a local_transaction tool may not run {head}: the runtime commits its writes "
                "together with the step checkpoint (raise an exception to roll both back)"
            )
