"""``"gemm": "native"`` in a plan file reaches ``snip train`` (the CLI's route to native GEMMs)."""

import json

import pytest
import torch

from snip.cli import main
from snip.nn import native as N

pytestmark = pytest.mark.skipif(not N.fp8_gemm_supported("cpu"),
                                reason="this torch has no CPU torch._scaled_mm")

ARGS = ["--model.name", "tiny", "--train.steps", "2", "--train.batch_size", "2",
        "--train.seq_len", "16", "--train.eval_every", "2", "--train.ckpt_every", "2",
        "--train.eval_batches", "1", "--train.threads", "1", "--train.device", "cpu"]
PLAN = {"version": 1, "default": {"fprop": "fp8_e4m3", "dgrad": "fp8_e4m3_row",
                                  "wgrad": "fp8_e4m3"}}


def test_plan_file_gemm_native_runs_scaled_mm_and_survives_resume(tmp_path, monkeypatch):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**PLAN, "gemm": "native"}))
    seen = []
    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: seen.append(1) or real(*a, **k))
    runs = tmp_path / "runs"
    assert main(["train", *ARGS, "--precision.plan", str(path), "--run.dir", str(runs),
                 "--run.name", "n"]) == 0
    assert len(seen) > 0  # the FP8 GEMMs went through torch._scaled_mm
    saved = json.loads((runs / "n" / "checkpoints" / "step_000002" / "plan.json").read_text())
    assert saved["gemm"] == "native"  # a --resume converts with it again
    seen.clear()
    assert main(["train", "--resume", str(runs / "n"), "--train.steps", "3"]) == 0
    assert len(seen) > 0


def test_plan_file_bad_gemm_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**PLAN, "gemm": "tensor-cores"}))
    assert main(["train", *ARGS, "--precision.plan", str(path), "--run.dir",
                 str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any("plan gemm" in line and "native" in line for line in err)


def test_precision_gemm_native_is_kept_across_replans(tmp_path, monkeypatch):
    seen = []
    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: seen.append(1) or real(*a, **k))
    runs = tmp_path / "runs"
    args = [a if a != "2" else "4" for a in ARGS]  # 4 steps, batch 4, eval/ckpt at 4
    assert main(["train", *args, "--precision.mode", "adaptive", "--precision.every", "2",
                 "--precision.warmup", "1", "--precision.gemm", "native",
                 "--precision.candidates", "fp8_e4m3,fp4_e2m1_tile128",
                 "--run.dir", str(runs), "--run.name", "a"]) == 0
    assert len(seen) > 0
    plans = sorted((runs / "a" / "plans").glob("step_*.json"))
    assert len(plans) >= 2  # the start plus at least one re-plan
    assert all(json.loads(p.read_text())["gemm"] == "native" for p in plans)


def test_precision_gemm_bad_value_is_a_one_line_error(tmp_path, capsys):
    assert main(["train", *ARGS, "--precision.gemm", "tensor-cores", "--run.dir",
                 str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "precision.gemm" in err[0] and "native" in err[0]
