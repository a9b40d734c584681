"""Flower 1.42's conversions between its legacy ``FitRes``/``Parameters`` and the Message API's
records (``flwr.compat.common.recorddict_compat``), which its SecAgg+ workflow and mod use: the
secure aggregation of ``fedbandit.flower.secure_aggregation`` must write and read exactly that
layout. ``WorkflowState`` is the state SecAgg+'s workflow passes between its stages, which
fedbandit runs one by one to set up keys ahead; ``SECAGG_STATE_KEY`` the record of the node's
state where its mod keeps its own, which fedbandit keeps one of per slot. Pinned to Flower 1.42
like the other internals (``require``)."""

from __future__ import annotations

from flwr.app import ArrayRecord, RecordDict
from flwr.common import FitIns, FitRes, Parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE
from flwr.compat.common import recorddict_compat
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState

from fedbandit.flower.internals import require_flower

__all__ = [
    "SECAGG_STATE_KEY",
    "WorkflowState",
    "fitins_to_records",
    "fitres_to_records",
    "parameters_to_record",
    "require",
]

#: The node's ``context.state`` record in which SecAgg+'s mod keeps its state.
SECAGG_STATE_KEY = RECORD_KEY_STATE


def require() -> None:
    """Refuse another Flower series: SecAgg+'s record layout and arithmetic are 1.42's."""
    require_flower("secure aggregation", "run without --secure-aggregation")


def fitins_to_records(fitins: FitIns) -> RecordDict:
    """A ``FitIns`` as SecAgg+'s workflow keeps it for the masked-vector stage (``fitins.*``)."""
    return recorddict_compat.fitins_to_recorddict(fitins, keep_input=True)


def fitres_to_records(fitres: FitRes) -> RecordDict:
    """A ``FitRes`` as the records SecAgg+'s mod and workflow parse (``fitres.*``)."""
    return recorddict_compat.fitres_to_recorddict(fitres, keep_input=True)


def parameters_to_record(parameters: Parameters) -> ArrayRecord:
    """``Parameters`` as the ``ArrayRecord`` SecAgg+'s workflow reads from its state."""
    return recorddict_compat.parameters_to_arrayrecord(parameters, keep_input=True)
