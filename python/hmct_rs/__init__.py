"""hmct_rs: accuracy debugging of quantized ONNX models (HzCalibration nodes).

The seeds' Python API on hmct-rs' Rust engine. Change the import lines and the
rest of a horizon_nn / hmct script stays::

    import hmct_rs.debug as dbg                      # was: import horizon_nn.debug as dbg
    from hmct_rs.ir import load_model, save_model    # was: from hmct.ir import ...
    from hmct_rs.common import find_input_calibration, find_output_calibration

Modules: :mod:`hmct_rs.debug` (the analyses), :mod:`hmct_rs.ir` (load, inspect,
edit, save models), :mod:`hmct_rs.common` (which calibration node belongs to which
node).
"""

from ._native import __version__
from .ir import Model, load_model, save_model

__all__ = ["__version__", "Model", "load_model", "save_model", "debug", "ir", "common"]


def __getattr__(name):
    # `hmct_rs.debug` etc. without importing every module up front.
    if name in ("debug", "ir", "common"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
