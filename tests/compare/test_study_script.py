"""benchmarks/snip_compare.py: an interrupted base resumes; --collect keeps the small JSON and
--restore puts it back."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import pytest

from _benchmarks import load
from snip.compare.arms import parse_arms
from snip.compare.sweep import Sweep

script = load("snip_compare", "snip_compare_script")


def test_collect_copies_results_plans_tables_and_damage(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    branch = sweep / "runs" / "b0_o0" / "snip@0.75+once"
    unfinished = sweep / "runs" / "b0_o0" / "bf16"
    files = {"result.json": "{}", "plans/step_5.json": "{\"p\": 1}",
             "sensitivity/step_5.json": "{\"t\": 1}", "sensitivity/step_5_cycle.json": "{}",
             "sensitivity/step_5_damage.json": "{\"d\": 1}", "config.toml": "a = 1\n",
             "metrics.jsonl": "{}\n", "checkpoints/step_5/model.pt": "weights"}
    for rel, text in files.items():
        for d in (branch, unfinished):
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
    (unfinished / "result.json").unlink()
    arms = parse_arms(["bf16", "snip@0.75/once"])
    (sweep / "sweep.json").write_text(json.dumps(
        Sweep(bases=("b",), arms=tuple(arms), steps=1, out=str(sweep)).to_dict()))
    for name in ("compare.json", "compare.md"):
        (sweep / name).write_text("interim statistics")
    base = tmp_path / "bases" / "s0"
    (base / "checkpoints" / "step_000005").mkdir(parents=True)
    (base / "metrics.jsonl").write_text("{\"loss\": 1}\n")
    (base / "config.toml").write_text("b = 2\n")
    dest = tmp_path / "dest"
    script.collect(sweep, dest, (base / "checkpoints" / "step_000005",))
    out = dest / "runs" / "b0_o0" / "snip@0.75+once"
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert got == ["config.toml.gz", "metrics.jsonl.gz", "plans/step_5.json", "result.json",
                   "sensitivity/step_5.json.gz", "sensitivity/step_5_damage.json"]
    assert gzip.decompress((out / "sensitivity/step_5.json.gz").read_bytes()) == b"{\"t\": 1}"
    assert not (dest / "runs" / "b0_o0" / "bf16").exists()  # unfinished: not collected
    assert (dest / "sweep.json").is_file()
    assert not (dest / "compare.md").exists() and not (dest / "compare.json").exists()
    assert gzip.decompress((dest / "bases" / "s0" / "metrics.jsonl.gz").read_bytes()) == \
        b"{\"loss\": 1}\n"


def test_collect_names_bases_by_seed_whatever_their_directory(tmp_path: Path) -> None:
    """Stage 2 keeps its fp8 bases in ``bases_fp8``: they are collected as ``bases/s<seed>``
    too (the directory's name decided it before, and any other name failed)."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps(
        Sweep(bases=("b",), arms=tuple(parse_arms(["bf16"])), steps=1, out=str(sweep)).to_dict()))
    base = tmp_path / "bases_fp8" / "s100"
    (base / "checkpoints" / "step_000005").mkdir(parents=True)
    (base / "metrics.jsonl").write_text("{}\n")
    (base / "config.toml").write_text("c = 3\n")
    dest = tmp_path / "dest"
    assert script.collect(sweep, dest, (base / "checkpoints" / "step_000005",)) == 3
    assert gzip.decompress((dest / "bases" / "s100" / "config.toml.gz").read_bytes()) == \
        b"c = 3\n"


def test_interrupted_base_stops_the_script_and_resumes(tmp_path: Path, ctrl_c_after) -> None:
    args = argparse.Namespace(bases="", out=str(tmp_path / "study"), seeds=[0, 1],
                              base_steps=12, steps=2, total_steps=14, warmup_steps=2,
                              model="tiny", high="bf16", lr=3e-3, batch=4, seq_len=32,
                              threads=1)
    bases = tmp_path / "study" / "bases"
    with ctrl_c_after(10), pytest.raises(SystemExit) as stop:  # Ctrl-C inside seed 0
        script.base_checkpoints(args)
    assert stop.value.code == 130
    assert [p.name for p in (bases / "s0" / "checkpoints").iterdir()] == ["step_000010"]
    assert not (bases / "s1").exists()  # the script stopped instead of going on
    got = script.base_checkpoints(args)  # run again: seed 0 continues, seed 1 trains
    assert [p.name for p in got] == ["step_000012"] * 2 and all(p.is_dir() for p in got)


def test_collect_keeps_the_statistics_only_of_a_finished_sweep(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    arms = parse_arms(["bf16", "low=preset:fp4_e2m1_tensor"])
    definition = Sweep(bases=("b0", "b1"), arms=tuple(arms), steps=1, out=str(sweep))
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps(definition.to_dict()))
    (sweep / "compare.md").write_text("statistics")
    branches = [definition.run_dir(u, a) for u in definition.units for a in arms]
    for branch in branches:
        branch.mkdir(parents=True)
        (branch / "result.json").write_text("{}")
    (branches[-1] / "result.json").unlink()
    script.collect(sweep, tmp_path / "part")
    assert not (tmp_path / "part" / "compare.md").exists()  # one branch short: no statistics
    (branches[-1] / "result.json").write_text("{}")
    script.collect(sweep, tmp_path / "all")
    assert (tmp_path / "all" / "compare.md").read_text() == "statistics"


def test_restore_undoes_collect_without_bases_or_overwrites(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    branch = sweep / "runs" / "b0_o0" / "bf16"
    files = {"result.json": "{\"r\": 1}", "plans/step_5.json": "{\"p\": 1}",
             "sensitivity/step_5.json": "{\"t\": 1}", "config.toml": "a = 1\n",
             "metrics.jsonl": "{\"loss\": 2}\n"}
    for rel, text in files.items():
        (branch / rel).parent.mkdir(parents=True, exist_ok=True)
        (branch / rel).write_text(text)
    definition = json.dumps(Sweep(bases=("b",), arms=tuple(parse_arms(["bf16"])), steps=1,
                                  out=str(sweep)).to_dict())
    (sweep / "sweep.json").write_text(definition)
    base = tmp_path / "bases" / "s0"
    (base / "checkpoints" / "step_000005").mkdir(parents=True)
    (base / "metrics.jsonl").write_text("{}\n")
    (base / "config.toml").write_text("b = 2\n")
    dest = tmp_path / "dest"
    script.collect(sweep, dest, (base / "checkpoints" / "step_000005",))
    fresh = tmp_path / "fresh"
    (fresh / "runs" / "b0_o0" / "bf16").mkdir(parents=True)
    (fresh / "runs" / "b0_o0" / "bf16" / "result.json").write_text("mine")
    assert script.restore(dest, fresh) == len(files)  # every file but the one already there
    got = {str(p.relative_to(fresh / "runs" / "b0_o0" / "bf16")): p.read_text()
           for p in (fresh / "runs" / "b0_o0" / "bf16").rglob("*") if p.is_file()}
    assert got == {**files, "result.json": "mine"}  # unpacked, and nothing overwritten
    assert (fresh / "sweep.json").read_text() == definition
    assert not (fresh / "bases").exists()  # bases are retrained, not restored


def test_restore_skips_a_unit_with_a_branch_missing(tmp_path: Path, capsys) -> None:
    """A unit's branches must all start from one base; the bases are retrained on resuming
    (perhaps on another CPU, with other bits), so only complete units come back."""
    sweep = tmp_path / "sweep"
    arms = parse_arms(["bf16", "low=preset:fp4_e2m1_tensor"])
    definition = Sweep(bases=("b0", "b1"), arms=tuple(arms), steps=1, out=str(sweep))
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps(definition.to_dict()))
    for u in definition.units:
        for a in arms:
            definition.run_dir(u, a).mkdir(parents=True)
            (definition.run_dir(u, a) / "result.json").write_text("{}")
    (definition.run_dir((1, 0), arms[1]) / "result.json").unlink()
    dest = tmp_path / "dest"
    script.collect(sweep, dest)
    fresh = tmp_path / "fresh"
    assert script.restore(dest, fresh) == 3  # sweep.json and unit 0's two results
    assert sorted(p.name for p in (fresh / "runs").iterdir()) == ["b0_o0"]
    assert "b1_o0" in capsys.readouterr().err
