"""The accuracy-debug analyses: Horizon's ``horizon_nn.debug``, on hmct-rs' engine.

A drop-in for the seeds' snippets (change the import line only)::

    import hmct_rs.debug as dbg
    import logging
    logging.getLogger().setLevel(logging.INFO)   # verbose=True logs at INFO
    node_message = dbg.get_sensitivity_of_nodes(
        model_or_file='./calibrated_model.onnx',
        metrics=['cosine-similarity', 'mse'],
        calibrated_data='./calibration_data/',
        output_node=None, node_type='node', data_num=None,
        verbose=True, interested_nodes=None)

Common arguments:

* ``model_or_file``: a path, the bytes of a model, an ``onnx.ModelProto`` or a
  :class:`hmct_rs.ir.Model` (an edited model goes in as it is, unsaved).
* ``calibrated_data``: a calibration-data folder (one sub-folder per model input
  holding ``0.npy``, ``1.npy``, ...) or a mapping input name -> list of numpy arrays,
  one per sample.
* Node lists take a name or a list of names; ``quantize_node`` and
  ``non_quantize_node`` take a nested list to (de)quantize several nodes together.

Results are the CLI's ``--json`` results as Python objects (``hmct-debugger ...
--json``). Mistakes in the arguments (unknown node names, with close matches
suggested; unknown metrics; a ``data_num`` beyond the data) raise
:class:`ValueError` with the CLI's message; files that cannot be read or written
raise :class:`OSError`. The GIL is released while the engine works, Ctrl-C stops a
long sweep within a model run, and progress shows through ``tqdm`` when it is
installed (``progress=False`` hides it, a callable ``progress(stage, done, total)``
gets it instead).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import _native
from .ir import Model, load_model

__all__ = [
    "get_sensitivity_of_nodes",
    "plot_acc_error",
    "plot_distribution",
    "get_channelwise_data_distribution",
    "sensitivity_analysis",
    "runall",
    "precision_table",
    "outliers",
    "info",
    "calibrate",
    "export_qdq",
    "mixed_precision",
    "greedy_int16",
]

logger = logging.getLogger("hmct_rs")

ModelLike = Union[str, "os.PathLike[str]", bytes, Model, Any]
DataLike = Union[str, "os.PathLike[str]", Mapping[str, Sequence[np.ndarray]]]
NodeNames = Union[str, Sequence[str]]
Progress = Union[bool, Callable[[str, int, int], Any]]
#: ``eval_fn(outputs_per_sample) -> float``: ``outputs_per_sample[i][k]`` is output
#: ``k`` (a numpy array) of sample ``i``.
EvalFn = Callable[[List[List[np.ndarray]]], float]

_METRICS = ("cosine-similarity", "mse", "mre", "sqnr", "chebyshev")


# ---- argument normalization ----


def _model(model_or_file: ModelLike) -> "_native.Model":
    if model_or_file is None:
        raise ValueError("model_or_file is required: a path, an onnx.ModelProto or a hmct_rs Model")
    return load_model(model_or_file)._native


def _data(calibrated_data: DataLike) -> Any:
    if calibrated_data is None:
        raise ValueError(
            "calibrated_data is required: a calibration-data folder or a dict of input name -> list of numpy arrays"
        )
    if isinstance(calibrated_data, (str, os.PathLike)):
        return os.fspath(calibrated_data)
    if isinstance(calibrated_data, Mapping):
        out = {}
        for name, samples in calibrated_data.items():
            if isinstance(samples, np.ndarray):
                raise ValueError(
                    f"calibrated_data[{name!r}] must be a list of numpy arrays, one per sample "
                    f"(got one array of shape {samples.shape}; use list(array) if its first axis is the samples)"
                )
            out[name] = [np.asarray(a) for a in samples]
        return out
    raise ValueError(
        f"calibrated_data must be a folder path or a dict of input name -> list of numpy arrays, "
        f"got {type(calibrated_data).__name__}"
    )


def _names(value: Optional[NodeNames], what: str) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    names = list(value)
    for n in names:
        if not isinstance(n, str):
            raise ValueError(f"{what} must be a name or a list of names, got {n!r}")
    return names


def _groups(value: Any, what: str) -> Optional[List[List[str]]]:
    """A name, a list of names (each its own group) or a nested list (groups)."""
    if value is None:
        return None
    if isinstance(value, str):
        return [[value]]
    groups = []
    for item in value:
        if isinstance(item, str):
            groups.append([item])
        elif isinstance(item, (list, tuple)) and all(isinstance(n, str) for n in item):
            groups.append(list(item))
        else:
            raise ValueError(f"{what} must be names or lists of names, got {item!r}")
    return groups


def _node_list(value: Any, what: str) -> Optional[tuple]:
    """quantize_node / non_quantize_node: (nested?, groups) as the engine takes it."""
    if value is None:
        return None
    if isinstance(value, str):
        return (False, [[value]])
    items = list(value)
    nested = any(not isinstance(i, str) for i in items)
    return (nested, _groups(items, what))


def _metrics(metrics: Union[str, Sequence[str]]) -> List[str]:
    return [metrics] if isinstance(metrics, str) else list(metrics)


def _one_metric(metric: Union[str, Sequence[str]], what: str) -> str:
    names = _metrics(metric)
    if len(names) != 1:
        raise ValueError(f"{what} takes one metric, got {len(names)}")
    return names[0]


def _count(value: Optional[int], what: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{what} must be at least 1, got {value!r}")
    return int(value)


def _index(value: Any, what: str) -> int:
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise ValueError(f"{what}: sample numbers count from 0, got {value!r}")
    return int(value)


def _number(v: Any) -> Any:
    """JSON spells non-finite figures as strings; they come back as floats."""
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    return v


def _numbers(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _numbers(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_numbers(v) for v in obj]
    return _number(obj)


def _loads(text: str) -> Any:
    return _numbers(json.loads(text))


def _log_table(table: str) -> None:
    # The seeds only set the root level (logging.getLogger().setLevel(logging.INFO))
    # and expect the table on the terminal, as logging.info() would print it.
    if not logging.getLogger().handlers and not logger.handlers:
        logging.basicConfig()
    logger.info("\n%s", table.rstrip("\n"))


class _Bar:
    """The progress callback given to the engine: tqdm bars (one per stage) when tqdm
    is installed and progress is wanted, the caller's function if one was given."""

    def __init__(self, progress: Progress):
        self._fn = progress if callable(progress) else None
        self._tqdm = None
        self._bar = None
        self._stage = None
        if progress is True:
            try:
                from tqdm.auto import tqdm

                self._tqdm = tqdm
            except ImportError:
                pass

    def callback(self) -> Optional[Callable[[str, int, int], None]]:
        if self._fn is None and self._tqdm is None:
            return None
        return self

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self._fn is not None:
            self._fn(stage, done, total)
            return
        if self._bar is None or stage != self._stage:
            self.close()
            self._stage = stage
            self._bar = self._tqdm(total=total, desc=stage, leave=False)
        self._bar.total = total
        self._bar.n = done
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "_Bar":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _analyzer(model_or_file: ModelLike, calibrated_data: DataLike, threads: int, cache_mb: Optional[int]):
    return _native.Analyzer(_model(model_or_file), _data(calibrated_data), threads, cache_mb)


# ---- the seeds' functions ----


def get_sensitivity_of_nodes(
    model_or_file: ModelLike,
    metrics: Union[str, Sequence[str]] = "cosine-similarity",
    calibrated_data: DataLike = None,
    output_node: Optional[NodeNames] = None,
    node_type: str = "node",
    data_num: Optional[int] = None,
    verbose: bool = False,
    interested_nodes: Optional[Sequence[Union[str, Sequence[str]]]] = None,
    *,
    save_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
    exclude_samples: Sequence[int] = (),
    shard: Optional[str] = None,
    full_result: bool = False,
    threads: int = 0,
    cache_mb: Optional[int] = None,
    progress: Progress = True,
) -> Dict[str, Any]:
    """Node quantization sensitivity: how much quantizing each node alone costs.

    Each candidate is run from the float model with only its calibration nodes
    quantized and compared with the float model on the outputs.

    Args:
        model_or_file: the calibrated model: a path, an ``onnx.ModelProto`` or a
            :class:`hmct_rs.ir.Model`.
        metrics: ``'cosine-similarity'`` (default), ``'mse'``, ``'mre'``, ``'sqnr'``,
            ``'chebyshev'``, or a list of them; the result is sorted by the first.
        calibrated_data: the calibration data: a folder, or a dict input name ->
            list of numpy arrays (one per sample).
        output_node: compare on this regular node's outputs (or these nodes')
            instead of the model outputs; each must be quantized. ``None``: the
            model outputs.
        node_type: ``'node'`` (quantized regular nodes, default), ``'weight'`` or
            ``'activation'`` (calibration nodes, one at a time).
        data_num: use the first ``data_num`` samples; ``None`` (default) uses all.
        verbose: log the sensitivity table (the seeds' layout) through
            :mod:`logging` at INFO (set the level to INFO to see it).
        interested_nodes: only these nodes (overrides ``node_type``); a sub-list is
            quantized together and reported as ``a+b``. ``None``: every candidate.
        save_dir: also write the table to ``save_dir/sensitivity_of_<node_type>.log``
            (the CLI's ``-s``).
        exclude_samples: samples (numbered from 0) the ranking leaves out, e.g. a
            near-empty one flagged in the result's ``warnings`` (the CLI's
            ``--exclude-samples``); they are still run and reported per sample.
        shard: ``"I/N"`` (1-based): only shard I of N of the candidates, split by
            estimated cost (the CLI's ``--shard``; see docs/sharding.md). Returns
            that shard's candidates; merge the parts with ``full_result=True`` and
            ``hmct-debugger merge`` for the exact unsharded result.
        full_result: return the whole result (the CLI's ``--json``: entries with
            ``per_sample`` figures, ``warnings`` about degenerate samples, the
            model and data digests) instead of ``{name: {metric: value}}``.
        threads: worker threads, 0 = all cores; results never depend on it.
        cache_mb: memory for cached float activations (default: half the
            available memory); results never depend on it.
        progress: ``True`` shows a tqdm bar when tqdm is installed, ``False``
            nothing; a callable gets ``(stage, done, total)``.

    Returns:
        ``{name: {metric: value}}``, most sensitive first (by the first metric);
        with ``full_result=True`` the CLI's ``--json`` as a dict.

    Raises:
        ValueError: unknown node names (with close matches), metrics or node type,
            an ``output_node`` that is not quantized, ``data_num`` out of range.
        OSError: the model or the data cannot be read.
    """
    analyzer = _analyzer(model_or_file, calibrated_data, threads, cache_mb)
    with _Bar(progress) as bar:
        text, table = analyzer.sensitivity(
            _metrics(metrics),
            node_type,
            _names(output_node, "output_node"),
            _count(data_num, "data_num"),
            _groups(interested_nodes, "interested_nodes"),
            [_index(i, "exclude_samples") for i in exclude_samples],
            None if shard is None else str(shard),
            bar.callback(),
        )
    result = _loads(text)
    if verbose:
        _log_table(table)
    if save_dir is not None:
        os.makedirs(save_dir, exist_ok=True)
        path = os.path.join(os.fspath(save_dir), f"sensitivity_of_{result['node_type']}.log")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(table)
        os.replace(tmp, path)
    if full_result:
        return result
    return {e["name"]: dict(e["values"]) for e in result["entries"]}


def plot_acc_error(
    save_dir: Union[str, "os.PathLike[str]"] = "./debug_result/",
    calibrated_data: DataLike = None,
    model_or_file: ModelLike = None,
    quantize_node: Optional[Any] = None,
    non_quantize_node: Optional[Any] = None,
    metric: str = "cosine-similarity",
    average_mode: bool = False,
    *,
    data_num: Optional[int] = None,
    format: str = "png",
    threads: int = 0,
    cache_mb: Optional[int] = None,
    progress: Progress = True,
) -> Dict[str, Any]:
    """Accumulated-error curves: the error of every node's output along the graph for
    partially quantized models, against the float model.

    Args:
        save_dir: folder for the figures (created if missing).
        calibrated_data: a calibration-data folder or a dict input name -> list of
            numpy arrays.
        model_or_file: the calibrated model (path, ModelProto or Model).
        quantize_node: quantize only these nodes: a list of names gives one curve
            per name, a nested list one curve per sub-list; ``['weight']``,
            ``['activation']`` or ``['weight', 'activation']`` quantize only the
            weights / activations.
        non_quantize_node: de-quantize these nodes from the calibrated model (same
            forms). One of the two must be given.
        metric: ``'cosine-similarity'`` (default), ``'mse'``, ``'mre'``, ``'sqnr'``
            or ``'chebyshev'``.
        average_mode: plot the running mean of each curve.
        data_num: samples to average over (default: the first one, as the seeds).
        format: ``'png'`` or ``'svg'``.
        threads, cache_mb, progress: see :func:`get_sensitivity_of_nodes`.

    Returns:
        The curves (the CLI's ``--json``), with ``"files"``: the figures written.

    Raises:
        ValueError: neither node list given, unknown names or metric.
        OSError: ``save_dir`` cannot be written.
    """
    analyzer = _analyzer(model_or_file, calibrated_data, threads, cache_mb)
    with _Bar(progress) as bar:
        text, files = analyzer.acc_error(
            _node_list(quantize_node, "quantize_node"),
            _node_list(non_quantize_node, "non_quantize_node"),
            _one_metric(metric, "metric"),
            bool(average_mode),
            _count(data_num, "data_num"),
            os.fspath(save_dir),
            format,
            bar.callback(),
        )
    result = _loads(text)
    result["files"] = files
    return result


def plot_distribution(
    save_dir: Union[str, "os.PathLike[str]"] = "./debug_result/",
    model_or_file: ModelLike = None,
    calibrated_data: DataLike = None,
    nodes_list: NodeNames = None,
    *,
    bins: int = 100,
    format: str = "png",
    threads: int = 0,
) -> Dict[str, Any]:
    """Value histograms on the first sample: for an activation calibration node its
    input (with the threshold and the max), for a weight calibration node the weight
    before and after fake quantization, for a regular node its output in the float
    and calibrated models and their difference.

    Args:
        save_dir: folder for the figures.
        model_or_file: the calibrated model (path, ModelProto or Model).
        calibrated_data: a calibration-data folder or a dict of lists of arrays.
        nodes_list: a node name or a list of them, any mix of the three kinds.
        bins: histogram bins.
        format: ``'png'`` or ``'svg'``.
        threads: worker threads (0 = all cores).

    Returns:
        The statistics and histogram counts (the CLI's ``--json``), with ``"files"``.

    Raises:
        ValueError: an empty list or unknown names (with close matches).
        OSError: ``save_dir`` cannot be written.
    """
    analyzer = _analyzer(model_or_file, calibrated_data, threads, 0)
    text, files = analyzer.distribution(_names(nodes_list, "nodes_list"), int(bins), os.fspath(save_dir), format)
    result = _loads(text)
    result["files"] = files
    return result


def get_channelwise_data_distribution(
    save_dir: Union[str, "os.PathLike[str]"] = "./debug_result/",
    model_or_file: ModelLike = None,
    calibrated_data: DataLike = None,
    nodes_list: NodeNames = None,
    axis: Optional[int] = None,
    *,
    format: str = "png",
    threads: int = 0,
) -> Dict[str, Any]:
    """Per-channel box plots (and a CSV of per-channel statistics) of calibration
    nodes' inputs.

    Args:
        save_dir: folder for the box plots and CSV files.
        model_or_file: the calibrated model (path, ModelProto or Model).
        calibrated_data: a calibration-data folder or a dict of lists of arrays.
        nodes_list: calibration node names (weight or activation).
        axis: the channel axis for every node; ``None``: the node's ``axis`` for
            weights (0 when absent), 1 for activations.
        format: ``'png'`` or ``'svg'``.
        threads: worker threads (0 = all cores).

    Returns:
        The per-channel statistics (the CLI's ``--json``), with ``"files"``.

    Raises:
        ValueError: a regular node, an unknown node or an axis out of range.
        OSError: ``save_dir`` cannot be written.
    """
    analyzer = _analyzer(model_or_file, calibrated_data, threads, 0)
    text, files = analyzer.channelwise(
        _names(nodes_list, "nodes_list"), None if axis is None else int(axis), os.fspath(save_dir), format
    )
    result = _loads(text)
    result["files"] = files
    return result


def sensitivity_analysis(
    model_or_file: ModelLike,
    calibrated_data: DataLike = None,
    pick_threshold: float = 0.999,
    data_num: Optional[int] = 1,
    sensitive_nodes: Optional[NodeNames] = None,
    save_dir: Union[str, "os.PathLike[str]"] = "./debug_result/",
    *,
    metric: str = "cosine-similarity",
    qtype: str = "float32",
    threads: int = 0,
    cache_mb: Optional[int] = None,
    progress: Progress = True,
) -> Dict[str, Any]:
    """Partial quantization of the sensitive nodes: each quantized alone, and the
    calibrated model with them de-quantized cumulatively (``partial_quantization.png``).

    Args:
        model_or_file: the calibrated model (path, ModelProto or Model).
        calibrated_data: a calibration-data folder or a dict of lists of arrays.
        pick_threshold: pick regular nodes whose cosine sensitivity is below this
            (when ``sensitive_nodes`` is empty).
        data_num: samples to use (default 1, as the seeds; ``None``: all).
        sensitive_nodes: analyse these nodes, in this order, instead of picking.
        save_dir: folder for the figure.
        metric: the metric of the series.
        qtype: what de-quantizing sets: ``'float32'`` (switch off) or ``'int16'``.
        threads, cache_mb, progress: see :func:`get_sensitivity_of_nodes`.

    Returns:
        The series (the CLI's ``--json``), with ``"files"``.
    """
    analyzer = _analyzer(model_or_file, calibrated_data, threads, cache_mb)
    with _Bar(progress) as bar:
        text, files = analyzer.sensitivity_analysis(
            float(pick_threshold),
            _count(data_num, "data_num"),
            _names(sensitive_nodes, "sensitive_nodes"),
            metric,
            qtype,
            os.fspath(save_dir),
            bar.callback(),
        )
    result = _loads(text)
    result["files"] = files
    return result


def runall(
    model_or_file: ModelLike,
    calibrated_data: DataLike = None,
    save_dir: Union[str, "os.PathLike[str]"] = "./debug_result",
    ns_metrics: Union[str, Sequence[str]] = "cosine-similarity",
    output_node: Optional[NodeNames] = None,
    node_type: Optional[str] = None,
    data_num: Optional[int] = None,
    verbose: bool = False,
    interested_nodes: Optional[Sequence[Union[str, Sequence[str]]]] = None,
    dis_nodes_list: Optional[NodeNames] = None,
    cw_nodes_list: Optional[NodeNames] = None,
    axis: Optional[int] = None,
    quantize_node: Optional[Any] = None,
    non_quantize_node: Optional[Any] = None,
    ae_metric: str = "cosine-similarity",
    average_mode: bool = False,
    pick_threshold: float = 0.999,
    sensitive_nodes: Optional[NodeNames] = None,
    *,
    format: str = "png",
    report: bool = True,
    threads: int = 0,
    cache_mb: Optional[int] = None,
    progress: Progress = True,
) -> Dict[str, Any]:
    """The whole debugging workflow into ``save_dir``: health checks, weight and
    activation sensitivity, distributions and box plots of the top nodes,
    accumulated-error curves, the sensitivity analysis, ``summary.json`` and
    ``report.html``.

    Args:
        model_or_file: the calibrated model (path, ModelProto or Model).
        calibrated_data: a calibration-data folder or a dict of lists of arrays.
        save_dir: the result folder (created; a re-run replaces runall's entries).
        ns_metrics: sensitivity metric(s), sorted by the first.
        output_node: compare sensitivities on this node's (these nodes') outputs.
        node_type: ``None`` (weight, then activation: the seeds' default flow),
            ``'node'``, ``'weight'`` or ``'activation'``.
        data_num: samples for the rankings and the sensitivity analysis (all by
            default).
        verbose: log the sensitivity tables at INFO.
        interested_nodes: only these sensitivity candidates (sub-lists together).
        dis_nodes_list: nodes whose distributions to plot (default: the top 5 of
            each ranking).
        cw_nodes_list: calibration nodes whose box plots to draw (default: those of
            the distributions).
        axis: channel axis of the box plots.
        quantize_node, non_quantize_node: the accumulated-error curves (default
            ``['weight', 'activation']``); see :func:`plot_acc_error`.
        ae_metric: the accumulated-error metric.
        average_mode: plot running means of the accumulated error.
        pick_threshold: the sensitivity analysis picks nodes below this.
        sensitive_nodes: the sensitivity analysis uses these nodes instead.
        format: ``'png'`` or ``'svg'``.
        report: write ``report.html``.
        threads, cache_mb, progress: see :func:`get_sensitivity_of_nodes`.

    Returns:
        ``summary.json``'s content.
    """
    options = {
        "ns_metrics": _metrics(ns_metrics),
        "output_node": _names(output_node, "output_node"),
        "node_type": node_type,
        "data_num": _count(data_num, "data_num"),
        "interested_nodes": _groups(interested_nodes, "interested_nodes"),
        "dis_nodes_list": None if dis_nodes_list is None else _names(dis_nodes_list, "dis_nodes_list"),
        "cw_nodes_list": None if cw_nodes_list is None else _names(cw_nodes_list, "cw_nodes_list"),
        "axis": axis,
        "quantize_node": _node_list(quantize_node, "quantize_node"),
        "non_quantize_node": _node_list(non_quantize_node, "non_quantize_node"),
        "ae_metric": ae_metric,
        "average_mode": bool(average_mode),
        "pick_threshold": float(pick_threshold),
        "sensitive_nodes": _names(sensitive_nodes, "sensitive_nodes"),
        "format": format,
        "report": bool(report),
    }
    analyzer = _analyzer(model_or_file, calibrated_data, threads, cache_mb)
    with _Bar(progress) as bar:
        text, tables = analyzer.runall(options, os.fspath(save_dir), bar.callback())
    if verbose:
        for table in tables:
            _log_table(table)
    return _loads(text)


# ---- ours ----


def precision_table(
    model_or_file: ModelLike,
    calibrated_data: DataLike,
    data_num: Optional[int] = 1,
    verbose: bool = False,
    *,
    shard: Optional[str] = None,
    threads: int = 0,
    cache_mb: Optional[int] = None,
    progress: Progress = True,
) -> Dict[str, Any]:
    """Per quantized node: the end-to-end error (that node quantized alone, measured on
    the outputs) against the per-layer error (measured on its own output), and the
    amplification between them. ``data_num`` defaults to one sample; ``verbose``
    logs the table at INFO; ``shard="I/N"`` computes only that part of the nodes
    (the CLI's ``--shard``). Returns the CLI's ``precision-table --json``."""
    analyzer = _analyzer(model_or_file, calibrated_data, threads, cache_mb)
    with _Bar(progress) as bar:
        text, table = analyzer.precision_table(
            _count(data_num, "data_num"), None if shard is None else str(shard), bar.callback()
        )
    if verbose:
        _log_table(table)
    return _loads(text)


def outliers(
    model_or_file: ModelLike,
    calibrated_data: DataLike,
    data_num: Optional[int] = 1,
    axis: int = 1,
    flag_ratio: float = 0.5,
    verbose: bool = False,
    *,
    threads: int = 0,
    cache_mb: Optional[int] = None,
    progress: Progress = True,
) -> Dict[str, Any]:
    """Per activation calibration node: outlier-channel ratios that show where
    per-tensor int8 wastes its range (channels on ``axis``; tensors whose
    ``level>=3`` ratio is at least ``flag_ratio`` are flagged). Returns the CLI's
    ``outliers --json``; ``verbose`` logs the table at INFO."""
    analyzer = _analyzer(model_or_file, calibrated_data, threads, cache_mb)
    with _Bar(progress) as bar:
        text, table = analyzer.outliers(_count(data_num, "data_num"), int(axis), float(flag_ratio), bar.callback())
    if verbose:
        _log_table(table)
    return _loads(text)


def info(
    model_or_file: ModelLike,
    calibrated_data: DataLike,
    per_node: bool = False,
    data_num: Optional[int] = None,
    *,
    threads: int = 0,
    progress: Progress = True,
) -> Dict[str, Any]:
    """Calibrated vs float outputs on each sample: cosine similarity, L1, L2 and
    Chebyshev distances, and their means (``mean_outputs``); ``per_node`` adds every
    quantized node's output. Returns the CLI's ``info --json`` (samples are labelled
    by index)."""
    analyzer = _analyzer(model_or_file, calibrated_data, threads, 0)
    with _Bar(progress) as bar:
        text = analyzer.info(bool(per_node), _count(data_num, "data_num"), bar.callback())
    return _loads(text)


def calibrate(
    model_or_file: ModelLike,
    calibrated_data: DataLike,
    method: str = "max",
    percentile: Optional[float] = None,
    qtype: str = "int8",
    weight_qtype: str = "int8",
    data_num: Optional[int] = None,
    save_path: Optional[Union[str, "os.PathLike[str]"]] = None,
    *,
    threads: int = 0,
    progress: Progress = True,
) -> Model:
    """Calibrates a float model: inserts HzCalibration nodes with thresholds from the
    data (``method``: ``'max'``, ``'percentile'``, ``'kl'`` or ``'mse'``;
    ``percentile``: the quantile for ``'percentile'``). Returns the calibrated
    :class:`~hmct_rs.ir.Model` (also saved to ``save_path`` if given); its
    ``calibration_report`` attribute holds the CLI's ``calibrate --json``."""
    with _Bar(progress) as bar:
        native, report = _native.calibrate(
            _model(model_or_file),
            _data(calibrated_data),
            method,
            percentile,
            qtype,
            weight_qtype,
            _count(data_num, "data_num"),
            threads,
            bar.callback(),
        )
    model = Model(native)
    model.calibration_report = _loads(report)
    if save_path is not None:
        model.save(save_path)
    return model


def export_qdq(
    model_or_file: ModelLike,
    save_path: Optional[Union[str, "os.PathLike[str]"]] = None,
    domain: Optional[str] = None,
) -> Model:
    """The model as standard QuantizeLinear/DequantizeLinear ONNX (what onnxruntime
    runs). ``domain``: ``None`` (standard ops when the opset allows, else
    ``'com.microsoft'``), ``'standard'`` or ``'com.microsoft'``. Returns the exported
    :class:`~hmct_rs.ir.Model` (also saved to ``save_path`` if given)."""
    native, used, quantized = _model(model_or_file).export_qdq(domain)
    model = Model(native)
    model.qdq_domain = used
    model.qdq_nodes = quantized
    if save_path is not None:
        model.save(save_path)
    return model


def _promoted(model_or_file: ModelLike, nodes: List[str], qtype: str) -> Model:
    model = load_model(model_or_file).copy()
    if nodes:
        model._native.promote(nodes, qtype)
    return model


def mixed_precision(
    model_or_file: ModelLike,
    calibrated_data: DataLike,
    target: float = 0.999,
    metric: str = "cosine-similarity",
    output_node: Optional[NodeNames] = None,
    qtype: str = "int16",
    budget: Optional[int] = None,
    data_num: Optional[int] = None,
    save_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
    *,
    eval_fn: Optional[EvalFn] = None,
    higher_is_better: bool = True,
    threads: int = 0,
    cache_mb: Optional[int] = None,
    progress: Progress = True,
) -> Dict[str, Any]:
    """The smallest prefix of the sensitivity ranking whose promotion to ``qtype``
    brings the model to ``target``.

    Args:
        model_or_file: the calibrated model (path, ModelProto or Model).
        calibrated_data: a calibration-data folder or a dict of lists of arrays.
        target: the value to reach: of ``metric`` on the outputs against the float
            model, or of ``eval_fn`` when one is given.
        metric: the tensor metric that ranks the nodes (and judges the steps
            without ``eval_fn``).
        output_node: rank and judge on these nodes' outputs instead of the model's.
        qtype: what promoted nodes get: ``'int16'`` or ``'float32'``.
        budget: promote at most this many nodes.
        data_num: samples to use (all by default).
        save_dir: write the curve, the result and, when reached, the promoted model
            and its ``quant_config.json`` (without ``eval_fn`` only).
        eval_fn: your task metric, ``eval_fn(outputs_per_sample) -> float``, where
            ``outputs_per_sample[i][k]`` is output ``k`` of sample ``i`` as a numpy
            array (float32 for float outputs). It is called once per step the search
            evaluates, in order, and never past the first step reaching the target.
        higher_is_better: with ``eval_fn``: True for accuracies (reach at least
            ``target``), False for errors (at most).
        threads, cache_mb, progress: see :func:`get_sensitivity_of_nodes`.

    Returns:
        The search (the CLI's ``mixed-precision --json`` without ``eval_fn``; with
        it, every evaluation in call order), plus ``"model"``: a
        :class:`~hmct_rs.ir.Model` with the chosen nodes promoted, and
        ``"promoted"``: their names.
    """
    analyzer = _analyzer(model_or_file, calibrated_data, threads, cache_mb)
    outputs = _names(output_node, "output_node")
    with _Bar(progress) as bar:
        if eval_fn is None:
            text, files = analyzer.mixed_precision(
                float(target), metric, outputs, qtype, _count(budget, "budget"), _count(data_num, "data_num"),
                None if save_dir is None else os.fspath(save_dir), bar.callback(),
            )
            result = _loads(text)
            result["files"] = files
            promoted = [s["node"] for s in result["curve"][1 : result["chosen"] + 1] if s["node"]]
        else:
            if save_dir is not None:
                raise ValueError("save_dir is not supported with eval_fn; save result['model'] instead")
            text = analyzer.task_search(
                "prefix", eval_fn, float(target), bool(higher_is_better), metric, outputs, qtype,
                _count(budget, "budget"), _count(data_num, "data_num"), bar.callback(),
            )
            result = _loads(text)
            promoted = result["evaluations"][result["chosen"]]["promoted"]
    result["promoted"] = promoted
    result["model"] = _promoted(model_or_file, promoted, qtype)
    return result


def greedy_int16(
    model_or_file: ModelLike,
    calibrated_data: DataLike,
    eval_fn: EvalFn,
    target: float,
    higher_is_better: bool = True,
    qtype: str = "int16",
    metric: str = "cosine-similarity",
    output_node: Optional[NodeNames] = None,
    budget: Optional[int] = None,
    data_num: Optional[int] = None,
    *,
    threads: int = 0,
    cache_mb: Optional[int] = None,
    progress: Progress = True,
) -> Dict[str, Any]:
    """Int16 until the metric holds: walks the sensitivity ranking (by ``metric``),
    promotes each node to ``qtype`` on trial and keeps it only when ``eval_fn``'s
    score improves; stops as soon as the score meets ``target``.

    ``eval_fn(outputs_per_sample) -> float`` is called once for the calibrated model
    and once per node tried (at most ``budget`` nodes), never after the target is
    met. Returns every evaluation (``"evaluations"``: node tried, promoted set,
    score, kept), whether the target was reached, ``"promoted"`` (the kept nodes of
    the chosen evaluation) and ``"model"`` (a :class:`~hmct_rs.ir.Model` with them
    promoted). See :func:`mixed_precision` for the other arguments.
    """
    if eval_fn is None or not callable(eval_fn):
        raise ValueError("eval_fn must be a function outputs_per_sample -> float")
    analyzer = _analyzer(model_or_file, calibrated_data, threads, cache_mb)
    with _Bar(progress) as bar:
        text = analyzer.task_search(
            "greedy", eval_fn, float(target), bool(higher_is_better), metric, _names(output_node, "output_node"),
            qtype, _count(budget, "budget"), _count(data_num, "data_num"), bar.callback(),
        )
    result = _loads(text)
    promoted = result["evaluations"][result["chosen"]]["promoted"]
    result["promoted"] = promoted
    result["model"] = _promoted(model_or_file, promoted, qtype)
    return result
