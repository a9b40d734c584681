"""Flower 1.42's conversions between its legacy ``FitRes``/``Parameters`` and the Message API's
records (``flwr.compat.common.recorddict_compat``), which its SecAgg+ workflow and mod use: the
secure aggregation of ``fedbandit.flower.secure_aggregation`` must write and read exactly that
layout. Pinned to Flower 1.42 like the other internals (``require``)."""

from __future__ import annotations

from flwr.app import ArrayRecord, RecordDict
from flwr.common import FitRes, Parameters
from flwr.compat.common import recorddict_compat

from fedbandit.flower.internals import require_flower

__all__ = ["fitres_to_records", "parameters_to_record", "require"]


def require() -> None:
    """Refuse another Flower series: SecAgg+'s record layout and arithmetic are 1.42's."""
    require_flower("secure aggregation", "run without --secure-aggregation")


def fitres_to_records(fitres: FitRes) -> RecordDict:
    """A ``FitRes`` as the records SecAgg+'s mod and workflow parse (``fitres.*``)."""
    return recorddict_compat.fitres_to_recorddict(fitres, keep_input=True)


def parameters_to_record(parameters: Parameters) -> ArrayRecord:
    """``Parameters`` as the ``ArrayRecord`` SecAgg+'s workflow reads from its state."""
    return recorddict_compat.parameters_to_arrayrecord(parameters, keep_input=True)
