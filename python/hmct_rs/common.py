"""Which calibration node belongs to which node: Horizon's ``hmct.common``.

::

    from hmct_rs.common import find_input_calibration, find_output_calibration

    for node in model.graph.nodes:
        if node.op_type in ["Conv"]:
            for i in range(len(node.inputs)):
                input_calib = find_input_calibration(node, i)
                if input_calib and input_calib.tensor_type == "feature":
                    input_calib.qtype = "int16"

The search follows HZCALIBRATION.md §5: upwards (inputs) or downwards (outputs)
through ops that do not change values (Reshape, Transpose, ...).
"""

from __future__ import annotations

from typing import Optional

from .ir import CalibrationNode, Node

__all__ = ["find_input_calibration", "find_output_calibration"]


def find_input_calibration(node: Node, index: Optional[int] = None) -> Optional[CalibrationNode]:
    """The calibration node quantizing input ``index`` of ``node``.

    Args:
        node: a node of a loaded model.
        index: the input's position; ``None`` tries every input in order.

    Returns:
        The :class:`~hmct_rs.ir.CalibrationNode` (the input's producer, searched
        upwards through skippable ops), or ``None``.
    """
    found = node.model._native.find_input_calibration(node.index, index)
    return None if found is None else node.model.graph.nodes[found]


def find_output_calibration(node: Node, index: Optional[int] = None) -> Optional[CalibrationNode]:
    """The first calibration node reading output ``index`` of ``node`` (every output
    when ``None``), searched downwards through skippable ops; a Conv read only by an
    Add is searched from the Add. ``None`` when there is none."""
    found = node.model._native.find_output_calibration(node.index, index)
    return None if found is None else node.model.graph.nodes[found]
