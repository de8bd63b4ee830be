"""Seed 001's IR section (hmct.ir / hmct.common), as written with only the import
lines changed; edits survive save and load and change runs as they should."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SEED_OTHER


def test_ir_snippet_as_written(workdir, capsys):
    from hmct_rs.ir import load_model, save_model
    from hmct_rs.common import find_input_calibration, find_output_calibration
    model = load_model("calibrated_model.onnx")
    # 修改特定激活/权重校准节点 采用特定的数据类型
    node = model.graph.node_mappings["ReduceMax_1317_HzCalibration"]
    print(node.qtype) # 支持读取node的数据类型
    node.qtype = "float32" # 支持配置int8,int16,float16,float32
    # 配置所有激活/权重校准节点 采用int16量化
    calibration_nodes = model.graph.type2nodes["HzCalibration"]
    # 配置所有激活节点采用int16
    for node in calibration_nodes:
        if node.tensor_type == "feature":
            node.qtype = "int16"
    # 配置所有权重节点采用int16
    for node in calibration_nodes:
        if node.tensor_type == "weight":
            node.qtype = "int16"
    # 配置所有校准节点采用int16
    for node in calibration_nodes:
        node.qtype = "int16"
    # 配置某一个普通节点采用int16
    for node in model.graph.nodes:
        if node.name in ["Conv_0"]:
            for i in range(len(node.inputs)):
                input_calib = find_input_calibration(node, i)
                # 要求能够在输入找到HzCalibration,并且tensor_type为feature类型
                if input_calib and input_calib.tensor_type == "feature":
                    input_calib.qtype = "int16"
    # 配置某一个普通节点输出为int16
    for node in model.graph.nodes:
        if node.name in ["Conv_0"]:
            output_calib = find_output_calibration(node)
            # 要求能够在输出找到HzCalibration,并且tensor_type为feature类型
            if output_calib and output_calib.tensor_type == "feature":
                input_calib.qtype = "int16"
    # 配置某个节点类型采用int16
    for node in model.graph.nodes:
        if node.op_type in ["Conv"]:
            for i in range(len(node.inputs)):
                input_calib = find_input_calibration(node, i)
                # 要求能够在输入找到HzCalibration,并且tensor_type为feature类型
                if input_calib and input_calib.tensor_type == "feature":
                    input_calib.qtype = "int16"
    # 修改特定激活/权重校准节点 采用特定的阈值
    node = model.graph.node_mappings["ReduceMax_1317_HzCalibration"]
    print(node.thresholds) # 支持读取node的阈值结果
    node.thresholds = [4.23] # 支持np.array, List[float]
    save_model(model, "calibrated_model_modified.onnx")

    printed = capsys.readouterr().out.split("\n")
    assert printed[0] == "int8"
    again = load_model("calibrated_model_modified.onnx")
    calibs = again.graph.type2nodes["HzCalibration"]
    assert calibs and all(c.qtype == "int16" for c in calibs)
    assert again.graph.node_mappings[SEED_OTHER].thresholds == pytest.approx([4.23])


def test_node_views(workdir):
    from hmct_rs.common import find_input_calibration, find_output_calibration
    from hmct_rs.ir import CalibrationNode, load_model

    model = load_model("calibrated_model.onnx")
    conv = model.graph.node_mappings["Conv_2"]
    assert conv.op_type == "Conv" and len(conv.inputs) >= 2 and conv.outputs
    x = find_input_calibration(conv, 0)
    w = find_input_calibration(conv, 1)
    assert isinstance(x, CalibrationNode) and x.tensor_type == "feature"
    assert w.tensor_type == "weight" and len(w.thresholds) > 1 and w.axis == 0
    assert x.outputs[0] == conv.inputs[0]
    out = find_output_calibration(conv)
    assert out is None or out.tensor_type == "feature"
    # thresholds as numpy, switch, and the edit is visible through every view.
    w.thresholds = np.asarray(w.thresholds, dtype=np.float64) * 2
    assert model.graph.node_mappings[w.name].thresholds == pytest.approx(
        [t for t in w.thresholds])
    x.switch = "OFF"
    assert model.graph.node_mappings[x.name].switch == "OFF"
    x.switch = True
    assert x.switch == "ON"
    assert model.graph.type2nodes["Conv"][0].name == "Conv_0"


def test_load_from_bytes_and_modelproto(workdir):
    import onnx

    from hmct_rs.ir import load_model

    proto = onnx.load("calibrated_model.onnx")
    a = load_model(proto)
    b = load_model(open("calibrated_model.onnx", "rb").read())
    c = load_model("calibrated_model.onnx")
    names = [n.name for n in c.graph.nodes]
    assert [n.name for n in a.graph.nodes] == names == [n.name for n in b.graph.nodes]
    assert a.to_onnx().graph.node[0].name == proto.graph.node[0].name


def _cosine(node_message):
    return min(v["cosine-similarity"] for v in node_message.values())


def test_int16_loses_less_than_int8_and_edits_go_straight_in(workdir):
    import hmct_rs.debug as dbg
    from hmct_rs.ir import load_model, save_model

    model = load_model("calibrated_model.onnx")
    before = dbg.info(model, "calibration_data", data_num=2)["mean_outputs"][0]["figures"]["cosine"]
    for node in model.graph.type2nodes["HzCalibration"]:
        node.qtype = "int16"
    # The edited model, unsaved.
    after = dbg.info(model, "calibration_data", data_num=2)["mean_outputs"][0]["figures"]["cosine"]
    assert after > before
    assert 1 - after < (1 - before) / 10
    # Saved and loaded: the same run.
    save_model(model, "int16.onnx")
    reloaded = dbg.info("int16.onnx", "calibration_data", data_num=2)["mean_outputs"][0]["figures"]["cosine"]
    assert reloaded == after
    # Sensitivities follow: every node loses less at int16.
    s8 = dbg.get_sensitivity_of_nodes("calibrated_model.onnx", calibrated_data="calibration_data", data_num=1)
    s16 = dbg.get_sensitivity_of_nodes(model, calibrated_data="calibration_data", data_num=1)
    assert _cosine(s16) > _cosine(s8)
    # Switching every calibration node off gives the float model.
    for node in model.graph.type2nodes["HzCalibration"]:
        node.switch = "OFF"
    off = dbg.info(model, "calibration_data", data_num=1)["mean_outputs"][0]["figures"]
    assert off["cosine"] == pytest.approx(1.0) and off["chebyshev"] == 0.0
