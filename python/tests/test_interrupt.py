"""Ctrl-C stops a long sweep (the GIL is released while the engine works and the
calling thread watches for signals), and progress reaches a callback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conftest import CLS, SHARED, need_shared

DET = SHARED / "models" / "rapidocr_ppocrv4_det"

SWEEP = textwrap.dedent(
    """
    import sys, time
    import hmct_rs.debug as dbg
    model = dbg.calibrate(sys.argv[1], sys.argv[2], data_num=1, progress=False)
    print("start", flush=True)
    try:
        dbg.get_sensitivity_of_nodes(model, calibrated_data=sys.argv[2], progress=False)
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    """
)

# KL calibration of every sample: tens of seconds, most of it inside model runs.
CALIBRATION = textwrap.dedent(
    """
    import sys, time
    import hmct_rs.debug as dbg
    print("start", flush=True)
    try:
        dbg.calibrate(sys.argv[1], sys.argv[2], method="kl", progress=False)
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    """
)


@pytest.mark.parametrize("child", [SWEEP, CALIBRATION], ids=["sweep", "calibration"])
def test_ctrl_c_stops_a_long_call(child):
    need_shared()
    if not DET.is_dir():
        pytest.skip(f"{DET} not found")
    proc = subprocess.Popen(
        [sys.executable, "-c", child, str(DET / "ch_PP-OCRv4_det_infer.onnx"), str(DET / "calibration_data")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "start"
        time.sleep(1.0)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        elapsed = time.monotonic() - sent
    finally:
        proc.kill()
    assert out.strip() == "interrupted", (out, err)
    # For the record (machine-dependent, not a pass/fail figure).
    print(f"Ctrl-C to return: {elapsed:.2f} s")


def test_other_threads_run_while_the_engine_works(workdir):
    import hmct_rs.debug as dbg

    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    stages = []
    t = threading.Thread(target=ticker)
    t.start()
    try:
        dbg.get_sensitivity_of_nodes("calibrated_model.onnx", calibrated_data="calibration_data",
                                     progress=lambda stage, done, total: stages.append((stage, done, total)))
    finally:
        stop.set()
        t.join()
    # The Python thread kept running during the sweep (the GIL was free).
    assert len(ticks) > 10
    assert stages and all(s == "sensitivity" and 0 < d <= n for s, d, n in stages)
    assert stages[-1][1] == stages[-1][2]
