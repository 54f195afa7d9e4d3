"""The operator verbs of ``effectflow``: each a thin layer over one public method of ``ef.Runtime``.

Reads (``runs``, ``show``, ``effects``, ``attention``: :mod:`.reads`) print rich tables or, with
``--json``, the records' ``to_dict()``. Actions (``reconcile``, ``recover``, ``resolve``,
``approve``, ``reject``, ``cancel``, ``resume``, ``compensate``: :mod:`.actions`) may execute
workflow code, so they take ``--app`` to import the application's tools and workflows first.
``bench`` is :mod:`.benchmark`; what they share (options, exit codes, the runtime a verb opens) is
:mod:`.common`.

This module is the one place ``effectflow.cli.main`` wires the verbs from.
"""

from __future__ import annotations

from effectflow.cli import common
from effectflow.cli.actions import (
    approve,
    cancel,
    compensate,
    reconcile,
    recover,
    reject,
    resolve,
    resume,
)
from effectflow.cli.benchmark import bench
from effectflow.cli.common import (
    EXIT_ATTENTION,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    read_only_url,
    run_exit_code,
)
from effectflow.cli.reads import attention, effects, runs, show

#: The name ``effectflow.cli.main``'s audit verbs call it by.
_require_ledger = common.require_ledger

__all__ = [
    "EXIT_ATTENTION",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "approve",
    "attention",
    "bench",
    "cancel",
    "compensate",
    "effects",
    "read_only_url",
    "reconcile",
    "recover",
    "reject",
    "resolve",
    "resume",
    "run_exit_code",
    "runs",
    "show",
]
