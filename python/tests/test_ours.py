"""The analyses hmct_rs adds beside the seeds' (info, precision_table, outliers,
calibrate): called with their defaults, each returns what the CLI's --json says
with its own defaults, sample labels included."""

from __future__ import annotations

from conftest import run_cli
from helpers import canon


def test_info_equals_the_cli_and_names_the_sample_files(workdir, cli):
    import hmct_rs.debug as dbg

    ours = dbg.info("calibrated_model.onnx", "calibration_data", data_num=2, progress=False)
    cli_json = run_cli(cli, "info", "calibrated_model.onnx", "calibration_data", "-n", "2", cwd=workdir)
    assert canon(ours) == canon(cli_json)
    labels = [s["sample"] for s in ours["samples"]]
    assert len(labels) == 2 and all(label.endswith(".npy") for label in labels), labels


def test_info_on_arrays_labels_samples_by_number(workdir):
    import numpy as np
    import hmct_rs.debug as dbg
    from hmct_rs.ir import load_model

    model = load_model("calibrated_model.onnx")
    (name,) = model.graph.inputs
    folder = workdir / "calibration_data"
    sub = next(p for p in folder.iterdir() if p.is_dir())
    arrays = [np.load(sub / f"{i}.npy") for i in range(2)]
    ours = dbg.info(model, {name: arrays}, progress=False)
    assert [s["sample"] for s in ours["samples"]] == ["sample 0", "sample 1"]


def test_precision_table_equals_the_cli(workdir, cli):
    import hmct_rs.debug as dbg

    ours = dbg.precision_table("calibrated_model.onnx", "calibration_data", progress=False)
    cli_json = run_cli(cli, "precision-table", "calibrated_model.onnx", "calibration_data", cwd=workdir)
    assert canon(ours) == canon(cli_json)


def test_outliers_equals_the_cli(workdir, cli):
    import hmct_rs.debug as dbg

    ours = dbg.outliers("calibrated_model.onnx", "calibration_data", progress=False)
    cli_json = run_cli(cli, "outliers", "calibrated_model.onnx", "calibration_data", cwd=workdir)
    assert canon(ours) == canon(cli_json)
    assert ours["flag_ratio"] == 0.5
