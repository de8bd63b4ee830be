"""Bad inputs raise the documented exception types with the CLI's messages, and
nothing half-written is left behind."""

from __future__ import annotations

import os

import numpy as np
import pytest


def test_unknown_names_are_value_errors_with_suggestions(workdir):
    import hmct_rs.debug as dbg

    with pytest.raises(ValueError, match=r"unknown node 'Conv_3'.*did you mean.*'Conv_2'"):
        dbg.get_sensitivity_of_nodes('calibrated_model.onnx', calibrated_data='calibration_data',
                                     interested_nodes=['Conv_3'])
    with pytest.raises(ValueError, match=r"unknown metric 'cosine'.*did you mean 'cosine-similarity'"):
        dbg.get_sensitivity_of_nodes('calibrated_model.onnx', metrics='cosine', calibrated_data='calibration_data')
    with pytest.raises(ValueError, match=r"unknown node type 'nodes'"):
        dbg.get_sensitivity_of_nodes('calibrated_model.onnx', calibrated_data='calibration_data', node_type='nodes')
    with pytest.raises(ValueError, match=r"data_num is 99 but the data has 8"):
        dbg.get_sensitivity_of_nodes('calibrated_model.onnx', calibrated_data='calibration_data', data_num=99)
    with pytest.raises(ValueError, match=r"data_num must be at least 1"):
        dbg.get_sensitivity_of_nodes('calibrated_model.onnx', calibrated_data='calibration_data', data_num=0)
    with pytest.raises(ValueError, match=r"quantize_node or non_quantize_node"):
        dbg.plot_acc_error(save_dir='out', calibrated_data='calibration_data', model_or_file='calibrated_model.onnx')
    with pytest.raises(ValueError, match=r"unknown node 'Conv_99'"):
        dbg.plot_distribution(save_dir='out', model_or_file='calibrated_model.onnx',
                              calibrated_data='calibration_data', nodes_list=['Conv_99'])
    # A failed analysis leaves no folder it created.
    assert not os.path.exists('out')


def test_files_are_os_errors(workdir, tmp_path):
    import hmct_rs.debug as dbg
    from hmct_rs.ir import load_model, save_model

    with pytest.raises(FileNotFoundError):
        load_model("missing.onnx")
    with pytest.raises(FileNotFoundError):
        dbg.get_sensitivity_of_nodes('missing.onnx', calibrated_data='calibration_data')
    with pytest.raises(FileNotFoundError, match="calibration-data folder not found"):
        dbg.get_sensitivity_of_nodes('calibrated_model.onnx', calibrated_data='no_such_folder')
    model = load_model('calibrated_model.onnx')
    with pytest.raises(OSError):
        save_model(model, tmp_path / "no" / "such" / "dir" / "m.onnx")
    # An unwritable result folder: a file where the folder should be.
    (tmp_path / "blocked").write_text("")
    with pytest.raises(OSError):
        dbg.plot_distribution(save_dir=tmp_path / "blocked", model_or_file=model,
                              calibrated_data='calibration_data', nodes_list=['Conv_2'])


def test_bad_models_and_edits_are_value_errors(workdir):
    from hmct_rs.ir import load_model

    with pytest.raises(ValueError, match="not an ONNX model"):
        load_model(b"definitely not a model")
    with pytest.raises(TypeError):
        load_model(42)
    model = load_model('calibrated_model.onnx')
    calib = model.graph.type2nodes["HzCalibration"][0]
    with pytest.raises(ValueError, match="qtype 'int7x' is not supported"):
        calib.qtype = "int7x"
    with pytest.raises(ValueError, match=rf"calibration node '{calib.name}'.*positive and finite"):
        calib.thresholds = [-1.0]
    with pytest.raises(ValueError, match="positive and finite"):
        calib.thresholds = np.array([np.nan], dtype=np.float32)
    with pytest.raises(ValueError, match="switch must be 'ON' or 'OFF'"):
        calib.switch = "maybe"
    assert calib.qtype == "int8" and calib.switch == "ON"  # nothing changed
    with pytest.raises(KeyError, match="did you mean"):
        model.graph.node("Conv_3")


def test_bad_in_memory_data(workdir):
    import hmct_rs.debug as dbg

    with pytest.raises(ValueError, match=r"'y' is not a model input.*'x'"):
        dbg.get_sensitivity_of_nodes('calibrated_model.onnx', calibrated_data={'y': [np.zeros((1, 3, 48, 192), np.float32)]})
    with pytest.raises(ValueError, match=r"'x'\[0\]: shape \[3, 48, 192\] does not match model input 'x'"):
        dbg.get_sensitivity_of_nodes('calibrated_model.onnx', calibrated_data={'x': [np.zeros((3, 48, 192), np.float32)]})
    with pytest.raises(ValueError, match=r"'x'\[1\]: dtype double does not match model input 'x'"):
        dbg.get_sensitivity_of_nodes('calibrated_model.onnx', calibrated_data={
            'x': [np.zeros((1, 3, 48, 192), np.float32), np.zeros((1, 3, 48, 192))]})
    with pytest.raises(ValueError, match="list of numpy arrays"):
        dbg.get_sensitivity_of_nodes('calibrated_model.onnx', calibrated_data={'x': np.zeros((2, 1, 3, 48, 192), np.float32)})
    with pytest.raises(ValueError, match="calibrated_data is required"):
        dbg.get_sensitivity_of_nodes('calibrated_model.onnx')


def test_in_memory_data_gives_the_folders_results(workdir):
    import hmct_rs.debug as dbg

    folder = os.path.join('calibration_data', 'x')
    arrays = [np.load(os.path.join(folder, f"{i}.npy")) for i in range(3)]
    # A non-contiguous view is read in logical order.
    arrays[1] = np.asfortranarray(arrays[1])
    from_folder = dbg.get_sensitivity_of_nodes('calibrated_model.onnx', metrics=['cosine-similarity', 'mse'],
                                               calibrated_data='calibration_data', data_num=3)
    from_memory = dbg.get_sensitivity_of_nodes('calibrated_model.onnx', metrics=['cosine-similarity', 'mse'],
                                               calibrated_data={'x': arrays})
    assert from_memory == from_folder
