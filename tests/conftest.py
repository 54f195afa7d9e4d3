"""Fixtures every test folder may use.

pytest puts this folder on ``sys.path`` when it loads this file (``tests/`` is not a package), so
helper modules beside it (``pg_server``) import by name from tests in any folder.
"""

from pg_server import private_pg, private_pg_server

__all__ = ["private_pg", "private_pg_server"]
