"""Load, inspect, edit and save calibrated ONNX models: Horizon's ``hmct.ir``.

A drop-in for the seeds' IR snippets::

    from hmct_rs.ir import load_model, save_model

    model = load_model("calibrated_model.onnx")
    node = model.graph.node_mappings["ReduceMax_1317_HzCalibration"]
    print(node.qtype)
    node.qtype = "float32"                      # int8, int16, float16, float32
    for node in model.graph.type2nodes["HzCalibration"]:
        if node.tensor_type == "feature":
            node.qtype = "int16"
    node.thresholds = [4.23]                    # a list or a numpy array
    save_model(model, "calibrated_model_modified.onnx")

Nodes are live views: an edit changes the model at once, and an edited model can
go straight into any :mod:`hmct_rs.debug` function without saving.

Errors: a missing or unreadable file raises :class:`OSError` (its errno subclass,
e.g. :class:`FileNotFoundError`); bytes that are not an ONNX model, a broken graph,
an unknown qtype or invalid thresholds raise :class:`ValueError` naming the node.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from . import _native

__all__ = [
    "Model",
    "Graph",
    "Node",
    "CalibrationNode",
    "load_model",
    "save_model",
]

PathLike = Union[str, "os.PathLike[str]"]


def load_model(model: Union[PathLike, bytes, Any]) -> "Model":
    """Reads a model.

    Args:
        model: a path to an ONNX file, the bytes of one, or an ``onnx.ModelProto``.
            QDQ models (QuantizeLinear/DequantizeLinear pairs) are read as
            calibrated models.

    Returns:
        The :class:`Model`. Nodes are sorted topologically and unnamed nodes get a
        name; nothing else of the file changes.

    Raises:
        OSError: the file cannot be read.
        ValueError: not an ONNX model, or its graph is broken (cycle, dangling
            input), with the node named.
        TypeError: ``model`` is none of the above.
    """
    if isinstance(model, Model):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        return Model(_native.Model.from_bytes(bytes(model)))
    if hasattr(model, "SerializeToString"):
        return Model(_native.Model.from_bytes(model.SerializeToString()))
    if isinstance(model, (str, os.PathLike)):
        return Model(_native.Model.load(os.fspath(model)))
    raise TypeError(
        f"expected a path, bytes, an onnx.ModelProto or a hmct_rs Model, got {type(model).__name__}"
    )


def save_model(model: "Model", path: PathLike) -> None:
    """Writes ``model`` to ``path`` atomically (a temporary file, then a rename), so a
    failure never leaves a half-written file.

    Raises:
        OSError: the file cannot be written.
    """
    if not isinstance(model, Model):
        raise TypeError(f"expected a hmct_rs Model, got {type(model).__name__}")
    model._native.save(os.fspath(path))


class Model:
    """An ONNX model with a validated, indexed graph; ``model.graph`` has the nodes."""

    def __init__(self, native: "_native.Model"):
        self._native = native
        self.graph = Graph(self)

    @property
    def file(self) -> str:
        """The file the model was read from (``<memory>`` for bytes)."""
        return self._native.file

    def save(self, path: PathLike) -> None:
        """Same as :func:`save_model`."""
        save_model(self, path)

    def to_bytes(self) -> bytes:
        """The bytes :func:`save_model` would write."""
        return self._native.to_bytes()

    def to_onnx(self) -> Any:
        """The model as an ``onnx.ModelProto`` (needs the ``onnx`` package)."""
        import onnx

        return onnx.load_from_string(self.to_bytes())

    def copy(self) -> "Model":
        """An independent copy (edits to one do not change the other)."""
        return Model(self._native.copy())

    def __repr__(self) -> str:
        return repr(self._native)


class Graph:
    """The main graph: its nodes in topological order and two indexes."""

    def __init__(self, model: Model):
        self._model = model
        self._nodes: Optional[List[Node]] = None

    @property
    def nodes(self) -> List["Node"]:
        """Every node, in topological order (calibration nodes are
        :class:`CalibrationNode`)."""
        if self._nodes is None:
            native = self._model._native
            self._nodes = [
                (CalibrationNode if native.is_calibration(i) else Node)(self._model, i, row)
                for i, row in enumerate(native.node_table())
            ]
        return list(self._nodes)

    @property
    def node_mappings(self) -> Dict[str, "Node"]:
        """Node name -> node."""
        return {n.name: n for n in self.nodes}

    @property
    def type2nodes(self) -> Dict[str, List["Node"]]:
        """op_type -> the nodes of that type, in graph order (e.g. ``"HzCalibration"``)."""
        out: Dict[str, List[Node]] = {}
        for n in self.nodes:
            out.setdefault(n.op_type, []).append(n)
        return out

    @property
    def inputs(self) -> List[str]:
        """The graph inputs the data feeds (initializers excluded)."""
        return self._model._native.inputs

    @property
    def outputs(self) -> List[str]:
        return self._model._native.outputs

    def node(self, name: str) -> "Node":
        """The node called ``name``; :class:`KeyError` with close names if none."""
        i = self._model._native.node_index(name)
        if i is None:
            close = self._model._native.suggestions(name)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            raise KeyError(f"no node named {name!r}{hint}")
        return self.nodes[i]


class Node:
    """A regular node: ``name``, ``op_type``, ``inputs``, ``outputs``."""

    def __init__(self, model: Model, index: int, row: Sequence[Any]):
        self._model = model
        self.index = index
        self.name: str = row[0]
        self.op_type: str = row[1]
        self.domain: str = row[2]
        self.inputs: List[str] = list(row[3])
        self.outputs: List[str] = list(row[4])

    @property
    def model(self) -> Model:
        return self._model

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Node)
            and other._model._native is self._model._native
            and other.index == self.index
        )

    def __hash__(self) -> int:
        return hash((id(self._model._native), self.index))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.op_type})>"


class CalibrationNode(Node):
    """An HzCalibration node: its quantization parameters, readable and writable.

    Every setter keeps the node consistent (stored ``scales``/``zero_point`` follow the
    thresholds and the qtype) and leaves the other attributes as they were.
    """

    @property
    def qtype(self) -> str:
        """``int8``, ``int16``, ``float16``, ``float32`` (also ``uint8``, ``uint16``,
        ``int4``). Setting an unknown type raises :class:`ValueError`."""
        return self._model._native.qtype(self.index)

    @qtype.setter
    def qtype(self, value: str) -> None:
        self._model._native.set_qtype(self.index, str(value))

    @property
    def thresholds(self) -> List[float]:
        """The thresholds (one per channel for per-channel nodes). Set with a list, a
        tuple, a number or a numpy array; they must be positive and finite
        (asymmetric unsigned nodes: ``[min, max]``), else :class:`ValueError`."""
        return self._model._native.thresholds(self.index)

    @thresholds.setter
    def thresholds(self, value: Union[Sequence[float], np.ndarray, float]) -> None:
        try:
            array = np.ascontiguousarray(np.asarray(value, dtype=np.float32).reshape(-1))
        except (TypeError, ValueError) as e:
            raise ValueError(f"calibration node '{self.name}': thresholds must be numbers ({e})") from None
        self._model._native.set_thresholds(self.index, array)

    @property
    def scales(self) -> List[float]:
        """The scale per channel, derived from the thresholds for integer types."""
        return self._model._native.scales(self.index)

    @property
    def zero_point(self) -> List[int]:
        return self._model._native.zero_point(self.index)

    @property
    def axis(self) -> Optional[int]:
        """The channel axis of per-channel nodes, if any."""
        return self._model._native.axis(self.index)

    @property
    def tensor_type(self) -> str:
        """``"feature"`` (an activation) or ``"weight"``."""
        return self._model._native.tensor_type(self.index)

    @property
    def switch(self) -> str:
        """``"ON"`` or ``"OFF"`` (OFF: the node passes its input through). Set with
        ``"ON"``/``"OFF"`` or a bool."""
        return "ON" if self._model._native.switch_on(self.index) else "OFF"

    @switch.setter
    def switch(self, value: Union[str, bool]) -> None:
        if isinstance(value, bool):
            on = value
        elif isinstance(value, str) and value.strip().upper() in ("ON", "OFF"):
            on = value.strip().upper() == "ON"
        else:
            raise ValueError(f"calibration node '{self.name}': switch must be 'ON' or 'OFF', got {value!r}")
        self._model._native.set_switch(self.index, on)

    def __repr__(self) -> str:
        return (
            f"<CalibrationNode {self.name!r} {self.tensor_type} {self.qtype} "
            f"thresholds={self.thresholds[:4]}{'...' if len(self.thresholds) > 4 else ''} {self.switch}>"
        )
