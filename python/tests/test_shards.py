"""`shard=`, `exclude_samples=` and `full_result=` of get_sensitivity_of_nodes and
precision_table: the Python side of `--shard`, `--exclude-samples` and the per-sample
figures, on the bundled example (no ../shared needed)."""

from __future__ import annotations

import pathlib

import pytest

import hmct_rs.debug as dbg

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL = str(REPO / "examples" / "tiny_cnn" / "calibrated_model.onnx")
DATA = str(REPO / "examples" / "tiny_cnn" / "calibration_data")
METRICS = ["cosine-similarity", "mse"]


def sweep(**kw):
    return dbg.get_sensitivity_of_nodes(MODEL, METRICS, DATA, progress=False, **kw)


def test_shards_cover_the_sweep_once_with_the_same_values():
    whole = sweep()
    for n in (2, 3):
        parts = [sweep(shard=f"{i}/{n}") for i in range(1, n + 1)]
        names = [name for p in parts for name in p]
        assert sorted(names) == sorted(whole), f"{n} shards"
        for p in parts:
            for name, values in p.items():
                assert values == whole[name]


def test_full_result_has_per_sample_figures_and_exclusion_leaves_them():
    full = sweep(full_result=True)
    samples = len(full["entries"][0]["per_sample"][METRICS[0]])
    assert samples > 1
    for e in full["entries"]:
        assert set(e["per_sample"]) >= set(METRICS)
        assert all(len(v) == samples for v in e["per_sample"].values())
    excluded = sweep(full_result=True, exclude_samples=[0])
    assert excluded["excluded_samples"] == [0]
    by_name = {e["name"]: e for e in full["entries"]}
    for e in excluded["entries"]:
        # Still run and reported per sample; only the ranking leaves sample 0 out.
        assert e["per_sample"] == by_name[e["name"]]["per_sample"]


def test_precision_table_shards_cover_the_nodes():
    whole = dbg.precision_table(MODEL, DATA, progress=False)
    parts = [dbg.precision_table(MODEL, DATA, shard=f"{i}/2", progress=False) for i in (1, 2)]
    names = sorted(r["node"] for p in parts for r in p["rows"])
    assert len(names) > 1
    assert names == sorted(r["node"] for r in whole["rows"])


@pytest.mark.parametrize("bad", ["0/3", "4/3", "x", "1/0"])
def test_bad_shards_are_value_errors(bad):
    with pytest.raises(ValueError, match="shard"):
        sweep(shard=bad)


def test_bad_sample_numbers_are_value_errors():
    with pytest.raises(ValueError):
        sweep(exclude_samples=[-1])
    with pytest.raises(ValueError):
        sweep(exclude_samples=[999])
