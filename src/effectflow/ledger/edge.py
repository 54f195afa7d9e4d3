"""Where a driver's exceptions become the ledger's: the edge of every store.

Callers of a store never catch ``sqlite3`` or psycopg exceptions. A store wraps each use of its
connection in ``driver_errors``: the driver's transient failures (the database away, a lock held
too long, a full disk) leave as ``errors.LedgerUnavailable``, anything else the database refused as
``errors.LedgerError``, the driver's exception kept as the cause. A local transaction's own
statements are the tool's: what they raise crosses the edge as it was (``ToolRaised``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from effectflow import errors


class ToolRaised(Exception):
    """Carries what a local transaction's own statements raised through the store's edge, which
    translates only the ledger's driver errors: the tool's are its own (``apply_with``)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


@contextmanager
def driver_errors(
    where: str, transient: tuple[type[BaseException], ...], driver: type[BaseException]
) -> Iterator[None]:
    """The backend's edge: a driver's exception leaves the store as a ``LedgerError`` (its cause
    kept), ``LedgerUnavailable`` when it is one of ``transient``; ``where`` names the ledger."""
    try:
        yield
    except ToolRaised as raised:
        raise raised.original from raised.original.__cause__
    except transient as exc:
        raise errors.LedgerUnavailable(
            f"the ledger ({where}) could not be reached or written "
            f"({type(exc).__name__}: {' '.join(str(exc).split())})"
        ) from exc
    except driver as exc:
        raise errors.LedgerError(
            f"the ledger ({where}) refused a statement "
            f"({type(exc).__name__}: {' '.join(str(exc).split())}); nothing of it was written"
        ) from exc


def driver_cause(exc: BaseException) -> BaseException:
    """What the driver raised, under the ``LedgerError`` the edge made of it."""
    if isinstance(exc, errors.LedgerError) and exc.__cause__ is not None:
        return exc.__cause__
    return exc
