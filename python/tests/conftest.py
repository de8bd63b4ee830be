"""Fixtures of the Python suite (run by tools/python-tests.sh).

The seeds' snippets name nodes of Horizon's own models ('Conv_2', '317_HzCalibration',
'ReduceMax_1317_HzCalibration', mnasnet's layers). So that they run exactly as
written, the fixture model is the PP-OCR classifier of ../shared/models, calibrated
by hmct_rs, with a few of its nodes renamed to those names (nodes only; tensors keep
their names, so the graph is unchanged).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARED = pathlib.Path(os.environ.get("HMCT_SHARED", REPO.parent / "shared"))
CLS = SHARED / "models" / "rapidocr_ppocr_cls"

#: Regular nodes (Conv, in graph order) renamed to the names the seeds use.
SEED_CONVS = [
    "Conv_0",
    "Conv_2",
    "mnasnet_1/lead_cell_0/op_0/depthwise_0/depthwise",
    "mnasnet_1/lead_cell_0/op_0/project_0/Conv2D",
    "mnasnet_1/lead_cell_1/op_0/depthwise_0/depthwise",
    "mnasnet_1/lead_cell_1/op_0/project_0/Conv2D",
]
#: The last Conv.
LAST_CONV = "Conv_90"
#: An activation calibration node, a weight calibration node, another activation one.
SEED_ACTIVATION = "317_HzCalibration"
SEED_WEIGHT = "471_HzCalibration"
SEED_OTHER = "ReduceMax_1317_HzCalibration"


def need_shared() -> None:
    if not CLS.is_dir():
        pytest.skip(f"{CLS} not found: the real-model tests need ../shared/models beside the repository")


@pytest.fixture(scope="session")
def cli() -> pathlib.Path:
    """The hmct-debugger binary (HMCT_DEBUGGER, else target/debug's)."""
    path = pathlib.Path(os.environ.get("HMCT_DEBUGGER", REPO / "target" / "debug" / "hmct-debugger"))
    if not path.is_file():
        pytest.skip(f"{path} not found: build it (cargo build -p hmct-cli --profile test) or set HMCT_DEBUGGER")
    return path


@pytest.fixture(scope="session")
def seed_model_dir(tmp_path_factory) -> pathlib.Path:
    """A folder with calibrated_model.onnx (seed names) and calibration_data/."""
    need_shared()
    import onnx

    import hmct_rs.debug as dbg

    root = tmp_path_factory.mktemp("seed_model")
    raw = root / "raw.onnx"
    dbg.calibrate(
        str(CLS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"),
        str(CLS / "calibration_data"),
        method="max",
        save_path=str(raw),
        progress=False,
    )
    proto = onnx.load(str(raw))
    nodes = proto.graph.node
    convs = [n for n in nodes if n.op_type == "Conv"]
    for node, name in zip(convs, SEED_CONVS):
        node.name = name
    convs[-1].name = LAST_CONV
    weight_inputs = {i.name for i in proto.graph.initializer}
    constant_outputs = {o for n in nodes if n.op_type == "Constant" for o in n.output}
    calibs = [n for n in nodes if n.op_type == "HzCalibration"]
    weights = [n for n in calibs if n.input[0] in weight_inputs | constant_outputs]
    activations = [n for n in calibs if n not in weights]
    activations[1].name = SEED_ACTIVATION
    weights[0].name = SEED_WEIGHT
    activations[-1].name = SEED_OTHER
    onnx.save(proto, str(root / "calibrated_model.onnx"))
    raw.unlink()
    (root / "calibration_data").symlink_to(CLS / "calibration_data", target_is_directory=True)
    return root


@pytest.fixture
def workdir(seed_model_dir, tmp_path, monkeypatch) -> pathlib.Path:
    """A fresh folder holding the seed model and data, as the current directory (the
    seeds use './calibrated_model.onnx' and './calibration_data/')."""
    shutil.copy(seed_model_dir / "calibrated_model.onnx", tmp_path / "calibrated_model.onnx")
    (tmp_path / "calibration_data").symlink_to(seed_model_dir / "calibration_data", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(cli: pathlib.Path, *args: str, cwd: pathlib.Path) -> dict:
    """Runs `hmct-debugger args... --json out.json` in cwd and returns the JSON."""
    out = cwd / "cli_result.json"
    proc = subprocess.run([str(cli), *args, "--json", str(out)], cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())
