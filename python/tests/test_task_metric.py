"""A task metric in the loop: eval_fn(outputs_per_sample) -> float judges the
mixed-precision search and the greedy int16 helper; it sees our probes' outputs and
is called once per configuration the search needs."""

from __future__ import annotations

import numpy as np
import pytest

from hmct_rs.ir import load_model


def _float_outputs(dbg, path):
    """The float model's outputs, as eval_fn sees them: every calibration node OFF,
    so the search's step 0 (the calibrated model) is the float model."""
    model = load_model(path)
    for node in model.graph.type2nodes["HzCalibration"]:
        node.switch = "OFF"
    seen = []

    def capture(outputs):
        seen.append(outputs)
        return 0.0

    result = dbg.mixed_precision(model, "calibration_data", target=0.0, eval_fn=capture, progress=False)
    assert result["reached"] and len(seen) == 1 and result["promoted"] == []
    return seen[0]


def _cosine(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_eval_fn_search_matches_the_metric_search(workdir):
    import hmct_rs.debug as dbg

    reference = _float_outputs(dbg, "calibrated_model.onnx")
    assert len(reference) == 8 and all(isinstance(o[0], np.ndarray) for o in reference)
    calls = []

    def mean_cosine(outputs_per_sample):
        calls.append(len(outputs_per_sample))
        return float(np.mean([_cosine(o[0], r[0]) for o, r in zip(outputs_per_sample, reference)]))

    # Unreachable: every step up to the budget is evaluated, once.
    capped = dbg.mixed_precision("calibrated_model.onnx", "calibration_data", target=1.0, budget=3,
                                 eval_fn=mean_cosine, progress=False)
    assert not capped["reached"] and len(capped["evaluations"]) == 4 and calls == [8] * 4
    scores = [e["score"] for e in capped["evaluations"]]
    # The tensor-metric search measures the same steps with the same probes.
    by_metric = dbg.mixed_precision("calibrated_model.onnx", "calibration_data", target=1.0, budget=3,
                                    metric="cosine-similarity", progress=False)
    assert [s["value"] for s in by_metric["curve"]] == pytest.approx(scores, abs=1e-6)
    assert [e["node"] for e in capped["evaluations"]] == [s["node"] for s in by_metric["curve"]]

    # Reachable at a step k: eval_fn is called k+1 times, never past it.
    k = 1 + int(np.argmax(scores[1:]))
    calls.clear()
    found = dbg.mixed_precision("calibrated_model.onnx", "calibration_data", target=scores[k],
                                eval_fn=mean_cosine, progress=False)
    assert found["reached"] and found["chosen"] <= k and len(calls) == found["chosen"] + 1
    assert found["promoted"] == [e["node"] for e in capped["evaluations"][1:found["chosen"] + 1]]
    # The returned model has exactly those nodes promoted.
    promoted = found["model"]
    from hmct_rs.common import find_input_calibration
    for name in found["promoted"]:
        calib = find_input_calibration(promoted.graph.node_mappings[name], 0)
        assert calib.qtype == "int16"


def test_greedy_int16_keeps_only_what_helps(workdir):
    import hmct_rs.debug as dbg

    reference = _float_outputs(dbg, "calibrated_model.onnx")
    calls = []

    def neg_max_error(outputs_per_sample):
        calls.append(1)
        return -max(float(np.max(np.abs(o[0] - r[0]))) for o, r in zip(outputs_per_sample, reference))

    result = dbg.greedy_int16("calibrated_model.onnx", "calibration_data", neg_max_error, target=0.0,
                              budget=5, progress=False)
    evals = result["evaluations"]
    assert len(calls) == len(evals) == 6 and not result["reached"]
    best = evals[0]["score"]
    for e in evals[1:]:
        assert e["kept"] == (e["score"] > best)
        if e["kept"]:
            best = e["score"]
    kept = [e["node"] for e in evals[1:] if e["kept"]]
    assert result["promoted"] == kept and evals[result["chosen"]]["score"] == best

    # A target met on the way stops the walk at once.
    if kept:
        calls.clear()
        goal = evals[[e["node"] for e in evals].index(kept[0])]["score"]
        stop = dbg.greedy_int16("calibrated_model.onnx", "calibration_data", neg_max_error, target=goal,
                                progress=False)
        assert stop["reached"] and stop["promoted"] == kept[:1] and len(calls) == len(stop["evaluations"])


def test_eval_fn_errors_propagate(workdir):
    import hmct_rs.debug as dbg

    def broken(outputs):
        raise ZeroDivisionError("from eval_fn")

    with pytest.raises(ZeroDivisionError, match="from eval_fn"):
        dbg.greedy_int16("calibrated_model.onnx", "calibration_data", broken, target=1.0, data_num=1)
    with pytest.raises(TypeError):
        dbg.greedy_int16("calibrated_model.onnx", "calibration_data", lambda o: "high", target=1.0, data_num=1)
