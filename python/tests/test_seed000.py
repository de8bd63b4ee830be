"""Seed 000 (horizon_nn.debug's manual): every snippet as written, only the import
line changed (`import horizon_nn.debug as dbg` -> `import hmct_rs.debug as dbg`);
results equal the CLI's --json."""

from __future__ import annotations

import logging
import os

from conftest import LAST_CONV, SEED_ACTIVATION, SEED_WEIGHT, run_cli
from helpers import canon, without


def test_get_sensitivity_of_nodes_snippet(workdir, cli, caplog):
    # 导入debug模块
    import hmct_rs.debug as dbg

    # 导入log日志模块
    import logging

    # 若verbose=True时，需要先设置log level为INFO
    logging.getLogger().setLevel(logging.INFO)
    # 获取节点量化敏感度
    node_message = dbg.get_sensitivity_of_nodes(
        model_or_file='./calibrated_model.onnx',
        metrics=['cosine-similarity', 'mse'],
        calibrated_data='./calibration_data/',
        output_node=None,
        node_type='node',
        data_num=None,
        verbose=True,
        interested_nodes=None)

    # The seeds' table went to the log.
    text = caplog.text
    assert "node sensitivity" in text and "cosine-similarity" in text and "mse" in text
    # A dict name -> {metric: value}, most sensitive (lowest cosine) first.
    assert isinstance(node_message, dict) and len(node_message) > 10
    first = next(iter(node_message.values()))
    assert list(first) == ["cosine-similarity", "mse"]
    cosines = [v["cosine-similarity"] for v in node_message.values()]
    assert cosines == sorted(cosines)
    assert "Conv_2" in node_message and LAST_CONV in node_message

    cli_json = run_cli(cli, "get-sensitivity-of-nodes", "calibrated_model.onnx", "calibration_data",
                       "-m", "['cosine-similarity','mse']", "-n", "node", cwd=workdir)
    expected = {e["name"]: e["values"] for e in cli_json["entries"]}
    assert list(expected) == list(node_message)
    assert canon(expected) == canon(node_message)


def test_plot_acc_error_snippets(workdir, cli):
    import hmct_rs.debug as dbg

    dbg.plot_acc_error(
        save_dir='./',
        calibrated_data='./calibration_data/',
        model_or_file='./calibrated_model.onnx',
        quantize_node=['Conv_2', 'Conv_90'],
        metric='cosine-similarity',
        average_mode=False)
    dbg.plot_acc_error(
        save_dir='./',
        calibrated_data='./calibration_data/',
        model_or_file='./calibrated_model.onnx',
        quantize_node=[['Conv_2'], ['Conv_2', 'Conv_90']],
        metric='cosine-similarity',
        average_mode=False)
    dbg.plot_acc_error(
        save_dir='./',
        calibrated_data='./calibration_data/',
        model_or_file='./calibrated_model.onnx',
        non_quantize_node=['Conv_2', 'Conv_90'],
        metric='cosine-similarity',
        average_mode=True)
    result = dbg.plot_acc_error(
        save_dir='./',
        calibrated_data='./calibration_data/',
        model_or_file='./calibrated_model.onnx',
        non_quantize_node=[['Conv_2'], ['Conv_2', 'Conv_90']],
        metric='cosine-similarity',
        average_mode=False)
    assert result["files"] and all(os.path.isfile(f) for f in result["files"])
    cli_json = run_cli(cli, "plot-acc-error", "calibrated_model.onnx", "calibration_data",
                       "-nq", "[['Conv_2'],['Conv_2','Conv_90']]", "-s", "cli_out", cwd=workdir)
    assert canon(without(result, "files")) == canon(cli_json)

    # 测试技巧: ranking, then de-quantize the top nodes.
    node_message = dbg.get_sensitivity_of_nodes(
        model_or_file='./calibrated_model.onnx',
        metrics='cosine-similarity',
        calibrated_data='./calibration_data/',
        output_node=None,
        node_type='node',
        verbose=False,
        interested_nodes=None)
    # node_message为字典类型，其key值为节点名称
    nodes = list(node_message.keys())
    # 通过nodes来指定不量化节点，可以方便使用
    dbg.plot_acc_error(
        save_dir='./',
        calibrated_data='./calibration_data/',
        model_or_file='./calibrated_model.onnx',
        non_quantize_node=[nodes[:1], nodes[:2]],
        metric='cosine-similarity',
        average_mode=True)

    result = dbg.plot_acc_error(
        save_dir='./',
        calibrated_data='./calibration_data/',
        model_or_file='./calibrated_model.onnx',
        quantize_node=['weight', 'activation'],
        metric='cosine-similarity',
        average_mode=False)
    cli_json = run_cli(cli, "plot-acc-error", "calibrated_model.onnx", "calibration_data",
                       "-q", "['weight','activation']", "-s", "cli_out", cwd=workdir)
    assert canon(without(result, "files")) == canon(cli_json)


def test_plot_distribution_and_channelwise_snippets(workdir, cli):
    import hmct_rs.debug as dbg

    result = dbg.plot_distribution(
        save_dir='./',
        model_or_file='./calibrated_model.onnx',
        calibrated_data='./calibration_data',
        nodes_list=['317_HzCalibration',  # 激活节点
                    '471_HzCalibration',  # 权重节点
                    'Conv_2'])  # 普通节点
    assert len(result["files"]) >= 3 and all(os.path.isfile(f) for f in result["files"])
    cli_json = run_cli(cli, "plot-distribution", "calibrated_model.onnx", "calibration_data",
                       "-n", f"['{SEED_ACTIVATION}','{SEED_WEIGHT}','Conv_2']", "-s", "cli_out", cwd=workdir)
    assert canon(without(result, "files")) == canon(cli_json)

    # The seed gives the signature only; here with its parameter names.
    result = dbg.get_channelwise_data_distribution(
        save_dir='./',
        model_or_file='./calibrated_model.onnx',
        calibrated_data='./calibration_data',
        nodes_list=['317_HzCalibration', '471_HzCalibration'],
        axis=None)
    assert any(f.endswith(".png") for f in result["files"])
    cli_json = run_cli(cli, "get-channelwise-data-distribution", "calibrated_model.onnx", "calibration_data",
                       "-n", f"['{SEED_ACTIVATION}','{SEED_WEIGHT}']", "-s", "cli_out", cwd=workdir)
    assert canon(without(result, "files")) == canon(cli_json)


def test_sensitivity_analysis_and_runall_snippets(workdir, cli):
    import hmct_rs.debug as dbg

    result = dbg.sensitivity_analysis(model_or_file='calibrated_model.onnx',
                                      calibrated_data='calibration_data',
                                      pick_threshold=0.9999,
                                      data_num=1,
                                      sensitive_nodes=[])
    assert os.path.isfile("debug_result/partial_quantization.png")
    cli_json = run_cli(cli, "sensitivity-analysis", "calibrated_model.onnx", "calibration_data",
                       "-p", "0.9999", "-d", "1", "-sd", "cli_out", cwd=workdir)
    assert canon(without(result, "files")) == canon(cli_json)

    summary = dbg.runall(model_or_file='calibrated_model.onnx', calibrated_data='calibration_data')
    assert os.path.isfile("debug_result/summary.json") and os.path.isfile("debug_result/report.html")
    assert summary["samples"] == 8 and summary["steps"]
    cli_json = run_cli(cli, "runall", "calibrated_model.onnx", "calibration_data", "-s", "cli_runall", cwd=workdir)
    # Timings, the command line and the folder differ by nature; the findings do not.
    for key in ("top", "distribution_nodes", "channelwise_nodes", "calibrated_metric", "float_metric",
                "sensitive_nodes", "samples"):
        assert canon(summary[key]) == canon(cli_json[key]), key


def test_verbose_logs_at_info_only(workdir, caplog):
    import hmct_rs.debug as dbg

    caplog.set_level(logging.WARNING)
    dbg.get_sensitivity_of_nodes('calibrated_model.onnx', calibrated_data='calibration_data',
                                 interested_nodes=['Conv_2'], verbose=True, data_num=1)
    assert "node sensitivity" not in caplog.text
    caplog.set_level(logging.INFO)
    dbg.get_sensitivity_of_nodes('calibrated_model.onnx', calibrated_data='calibration_data',
                                 interested_nodes=['Conv_2'], verbose=True, data_num=1)
    assert "node sensitivity" in caplog.text and "Conv_2" in caplog.text
