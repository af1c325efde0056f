"""Reports from hand-written run directories (no training needed)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from snip.report import load_run, summary, write_report


def _fake_run(root: Path, name: str, fp4_after: int) -> Path:
    run = root / name
    (run / "plans").mkdir(parents=True)
    (run / "config.toml").write_text('seed = 1\n[model]\nname = "tiny"\n')
    events = []
    for step in range(1, 21):
        events.append({"event": "train", "step": step, "loss": 5.0 / step ** 0.3, "lr": 1e-3,
                       "tokens_per_s": 1000.0 + step, "fp4_flop_fraction":
                       1.0 if step > fp4_after else 0.0, "time": step * 0.1, "skipped": 0})
        if step % 10 == 0:
            events.append({"event": "eval", "step": step, "val_loss": 4.0 / step ** 0.2,
                           "ppl": 2.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"torn')
    layers = ["layers.0.attention.wq", "layers.0.feed_forward.w1"]
    for step, fmt in ((0, "fp8_e4m3_tile128"), (fp4_after, "mxfp4")):
        plan = {"version": 1, "default": dict.fromkeys(("fprop", "dgrad", "wgrad"), "bf16"),
                "layers": {n: dict.fromkeys(("fprop", "dgrad", "wgrad"), fmt) for n in layers},
                "meta": {"step": step}}
        (run / "plans" / f"step_{step}.json").write_text(json.dumps(plan))
    return run


def test_single_run_report_is_self_contained(tmp_path: Path) -> None:
    run = _fake_run(tmp_path, "a", fp4_after=10)
    html = write_report([run]).read_text()
    assert html.count("data:image/png;base64,") == 5 and "<img src=\"http" not in html
    png = html.split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n"
    for f in ("loss.png", "lr.png", "precision_map.png", "fp4_fraction.png", "throughput.png"):
        assert (run / f).is_file()
    s = summary(load_run(run))
    assert s["steps"] == 20 and s["plans applied"] == 2 and s["FP4 FLOP fraction (final)"] == 1


def test_comparison_needs_out_and_overlays(tmp_path: Path) -> None:
    a, b = _fake_run(tmp_path, "a", 5), _fake_run(tmp_path, "b", 15)
    with pytest.raises(ValueError, match="--out"):
        write_report([a, b])
    out = write_report([a, b], out=tmp_path / "cmp")
    assert {"precision_map_a.png", "precision_map_b.png", "loss.png"} <= {
        p.name for p in out.parent.iterdir()}
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        load_run(tmp_path / "missing")
