"""Seed 003 (the mnasnet analysis in Python), its four calls as written with the
import line changed. The seed's text has three typos that make it invalid Python
(full-width `）` and `，`, and `data_num: int = None,` inside a call); they are
fixed here (`)`, `,`, `data_num = None,`) and nothing else."""

from __future__ import annotations

import os

from conftest import run_cli
from helpers import canon, without


def test_mnasnet_analysis(workdir, cli):
    import hmct_rs.debug as dbg

    # 1.1
    dbg.plot_acc_error(
    save_dir='./', # 结果保存路径
    calibrated_data='./calibration_data', # 校准数据
    model_or_file='./calibrated_model.onnx', # 校准模型
    quantize_node=['weight', 'activation'], # 量化节点列表，当设置为['weight','activation']时则分别只量化权重和激活
    metric='cosine-similarity', # 计算误差的方式（度量方式）
    average_mode=False # 是否采用平均累积误差作为输出
    )

    # 2.1
    node_message = dbg.get_sensitivity_of_nodes(
    model_or_file='./calibrated_model.onnx', # 校准模型
    metrics='cosine-similarity', # 计算敏感度的方式（度量方式）
    calibrated_data='./calibration_data/', # 校准数据
    output_node=None, # 选取模型中某个节点的输出用于计算敏感度，默认(None)则采用模型的最终输出
    node_type='node', # 节点类型
    data_num = None,
    verbose=True, # 是否在终端显示计算结果。True显示，反之，不显示
    interested_nodes=None # 选择某些节点只计算这些节点的敏感度。默认(None)计算模型所有节点
    )
    assert all(list(v) == ["cosine-similarity"] for v in node_message.values())

    # 3.1
    dbg.plot_distribution(save_dir='./',
    model_or_file='./calibrated_model.onnx',
    calibrated_data='./calibration_data',
    nodes_list=['mnasnet_1/lead_cell_0/op_0/depthwise_0/depthwise',
    'mnasnet_1/lead_cell_1/op_0/project_0/Conv2D',
    'mnasnet_1/lead_cell_1/op_0/depthwise_0/depthwise',
    'mnasnet_1/lead_cell_0/op_0/project_0/Conv2D'])
    pngs = [f for f in os.listdir(".") if f.startswith("node_output_") and f.endswith(".png")]
    assert len(pngs) >= 4

    # 4.1
    result = dbg.plot_acc_error(
    save_dir='./', # 结果保存路径
    calibrated_data='./calibration_data', # 校准数据
    model_or_file='./calibrated_model.onnx', # 校准模型
    quantize_node=[['mnasnet_1/lead_cell_0/op_0/depthwise_0/depthwise'],
    ['mnasnet_1/lead_cell_0/op_0/depthwise_0/depthwise',
    'mnasnet_1/lead_cell_1/op_0/project_0/Conv2D'],
    ['mnasnet_1/lead_cell_0/op_0/depthwise_0/depthwise',
    'mnasnet_1/lead_cell_1/op_0/project_0/Conv2D',
    'mnasnet_1/lead_cell_1/op_0/depthwise_0/depthwise'],
    ['mnasnet_1/lead_cell_0/op_0/depthwise_0/depthwise',
    'mnasnet_1/lead_cell_1/op_0/project_0/Conv2D',
    'mnasnet_1/lead_cell_1/op_0/depthwise_0/depthwise',
    'mnasnet_1/lead_cell_0/op_0/project_0/Conv2D']], # 四种部分量化方式对应图中的partial_qmodel_0 ~ partial_qmodel_3
    metric='cosine-similarity', # 计算误差的方式（度量方式）
    average_mode=False # 是否采用平均累积误差作为输出
    )
    curves = [c["label"] for f in result["figures"] for c in f["curves"]]
    assert curves == [f"partial_qmodel_{i}" for i in range(4)] + ["calibrated_model"]
    a, b, c, d = ("mnasnet_1/lead_cell_0/op_0/depthwise_0/depthwise",
                  "mnasnet_1/lead_cell_1/op_0/project_0/Conv2D",
                  "mnasnet_1/lead_cell_1/op_0/depthwise_0/depthwise",
                  "mnasnet_1/lead_cell_0/op_0/project_0/Conv2D")
    nested = f"[['{a}'],['{a}','{b}'],['{a}','{b}','{c}'],['{a}','{b}','{c}','{d}']]"
    cli_json = run_cli(cli, "plot-acc-error", "calibrated_model.onnx", "calibration_data",
                       "-q", nested, "-s", "cli_out", cwd=workdir)
    assert canon(without(result, "files")) == canon(cli_json)
