"""benchmarks/gpu_check.py does not rot: its --cpu-dry-run runs every section at tiny sizes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def test_cpu_dry_run_runs_every_section(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu-dry-run", "--out", str(out)],
                          capture_output=True, text=True, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["dry_run"] is True
    for section in ("bitexact", "quantizer", "linear", "train"):
        assert "error" not in report[section], report[section]
    assert report["bitexact"]["all_equal"] and report["bitexact"]["cases"] > 100
    rows = report["quantizer"]["presets"]
    assert all(r["snip_rne_GBps"] > 0 for r in rows.values())
    sizes = report["linear"]["sizes"]
    assert all("fp8_e4m3_row_native_ms" in s and "bf16_linear_ms" in s for s in sizes.values())
    sqnr = report["linear"]["sqnr_native_vs_emulated_db"]
    assert set(sqnr) == {"fp8_e4m3", "fp8_e4m3_row"}
    assert all(v > 60 for d in sqnr.values() for v in d.values())
    train = report["train"]
    assert train["exit_code"] == 0 and train["last_loss"] is not None
    assert len(train["plans"]) >= 2  # adaptive: the warm-up plan and at least one re-plan
    assert "gpu_check: OK" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_cuda_exits_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "--cpu-dry-run" in lines[0]
