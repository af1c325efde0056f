"""snip compare: arm syntax, paired statistics on known effects, and a sweep end to end.

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from snip.cli import main
from snip.compare import Kind, paired, parse_arm, parse_arms, percentile_among
from snip.compare.sweep import Outcome, Sweep, run_sweep
from snip.errors import UserError
from snip.train import from_sources, train

# -- arms ---------------------------------------------------------------------------------------


def test_arm_syntax(tmp_path: Path) -> None:
    (a,) = parse_arm("bf16")
    assert (a.label, a.kind, a.preset) == ("bf16", Kind.PRESET, "bf16")
    (a,) = parse_arm("fp4=preset:fp4_e2m1_tile128")
    assert (a.label, a.preset) == ("fp4", "fp4_e2m1_tile128")
    plan = tmp_path / "mixed.json"
    plan.write_text("{}")
    (a,) = parse_arm(f"plan:{plan}")
    assert (a.label, a.kind) == ("mixed", Kind.PLAN)
    (a,) = parse_arm("snip@0.75")
    assert (a.label, a.method, a.budget) == ("snip@0.75", "ilp", 0.75)
    assert a.overrides()["precision.warmup"] == 0
    draws = parse_arm("random@0.5x3")
    assert [d.label for d in draws] == ["random@0.5#0", "random@0.5#1", "random@0.5#2"]
    assert {d.family for d in draws} == {"random@0.5"}
    assert [d.overrides()["precision.plan_seed"] for d in draws] == [0, 1, 2]
    (a,) = parse_arm("oracle@0.75")
    assert (a.label, a.kind, a.method) == ("oracle@0.75", Kind.ADAPTIVE, "oracle")
    assert a.overrides()["precision.method"] == "oracle"


@pytest.mark.parametrize("bad, message", [
    ("fp5", "not a preset"), ("snip@1.5", "in [0, 1]"), ("magic@0.5", "unknown method"),
    ("layer_type@0.5x3", "random@BUDGET only"), ("plan:/nonexistent.json", "not found"),
    ("oracle@0.5x2", "random@BUDGET only"), ("oracle@2", "in [0, 1]"),
    ("a b=bf16", "label"), ("snip@", "expected"),
])
def test_bad_arm_is_a_user_error(bad: str, message: str) -> None:
    with pytest.raises(UserError, match=re.escape(message)):
        parse_arm(bad)


def test_duplicate_labels_are_refused() -> None:
    with pytest.raises(UserError, match="two arms"):
        parse_arms(["bf16", "bf16=preset:fp8_e4m3"])
    # two labels that name one run directory ("/" -> "+", ":" -> "-")
    with pytest.raises(UserError, match="share the run directory 'random_top@0.5-1'"):
        parse_arms(["random_top@0.5:1", "random_top@0.5-1=layer_id@0.5"])


def test_an_explicit_label_may_spell_a_default_label() -> None:
    """A label may use the characters of default labels, so an arm with a modifier can carry
    the label its plain spelling has (e.g. the one a hypotheses file names)."""
    (a,) = parse_arm("random_top@0.875:1=random_top@0.875:1/every:140")
    assert (a.label, a.every, a.top, a.dirname) == ("random_top@0.875:1", 140, 1,
                                                    "random_top@0.875-1")
    (b,) = parse_arm("snip/adaptive=snip@0.5/every:3")
    assert (b.label, b.dirname) == ("snip/adaptive", "snip+adaptive")


# -- statistics ---------------------------------------------------------------------------------


def _units(rng: np.random.Generator, effect: float, n: int = 8) -> tuple[list, list]:
    unit = rng.normal(3.0, 0.5, size=n)  # each unit's own difficulty, shared by both arms
    ref = unit + rng.normal(0, 0.01, size=n)
    arm = unit + effect + rng.normal(0, 0.01, size=n)
    return arm.tolist(), ref.tolist()


@pytest.mark.parametrize("effect", [-0.02, 0.0])
def test_paired_interval_covers_the_true_effect_95_percent_of_the_time(effect: float) -> None:
    rng = np.random.default_rng(0)
    covered = 0
    trials = 400
    for _ in range(trials):
        arm, ref = _units(rng, effect)
        p = paired("a", arm, "ref", ref)
        covered += p.ci_low <= effect <= p.ci_high
    assert 0.92 <= covered / trials <= 0.98


def test_paired_resolves_a_clear_effect_that_unpaired_means_cannot() -> None:
    rng = np.random.default_rng(1)
    arm, ref = _units(rng, -0.05, n=12)
    p = paired("a", arm, "ref", ref)
    assert p.n == 12 and p.resolved and p.ci_low < -0.05 < p.ci_high and p.ci_high < 0
    assert p.sign_p < 0.01 and p.wilcoxon_p < 0.01
    assert np.std(arm) > 5 * abs(p.mean)  # unpaired, the units' spread would swamp it


def test_paired_edge_cases() -> None:
    one = paired("a", [1.0], "ref", [2.0])
    assert one.n == 1 and np.isnan(one.ci_low) and not one.resolved
    with pytest.raises(ValueError, match="same non-zero number"):
        paired("a", [1.0, 2.0], "ref", [1.0])
    assert percentile_among(1.0, [0.5, 2.0, 3.0, 1.0]) == pytest.approx(62.5)


# -- a sweep end to end -------------------------------------------------------------------------


@pytest.fixture
def base(tiny: dict) -> Path:
    train(from_sources(overrides={**tiny, "run.name": "base", "precision.preset": "bf16"}))
    return Path(tiny["run.dir"]) / "base" / "checkpoints" / "step_000012"


def test_compare_three_arms_two_orders(base: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cmp"
    argv = ["compare", "--base", str(base), "--steps", "4", "--orders", "2", "--arm", "bf16",
            "--arm", "fp4=preset:mxfp4", "--arm", "layer_type@0.5", "--reference", "bf16",
            "--gap", "fp4", "--eval-batches", "2", "--out", str(out), "--threads", "1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| fp4 | 2 |" in printed and "diff vs bf16" in printed
    summary = json.loads((out / "compare.json").read_text())
    rows = {r["arm"]: r for r in summary["rows"]["val_loss_hp"]}
    assert rows["fp4"]["n"] == 2 and rows["fp4"]["fp4_flop_fraction"] == 1.0
    assert rows["layer_type@0.5"]["fp4_flop_fraction"] <= 0.5 + 1e-9
    # paired: the per-unit differences are recomputable from the arms' own results
    res = summary["results"]
    d = [f["val_loss_hp"] - b["val_loss_hp"] for f, b in zip(res["fp4"], res["bf16"],
                                                             strict=True)]
    assert rows["fp4"]["diff"] == pytest.approx(sum(d) / 2)
    # the bf16 arm is the parent's own recipe: order 0 continues the parent exactly, order 1
    # sees other batches
    o0 = json.loads((out / "runs/b0_o0/bf16/result.json").read_text())
    o1 = json.loads((out / "runs/b0_o1/bf16/result.json").read_text())
    assert o0["step"] == o1["step"] == 16 and o0["val_loss"] != o1["val_loss"]
    html = (out / "report.html").read_text()
    assert "Paired comparison against bf16" in html and "layer_type@0.5" in html
    (out / "report.html").unlink()
    assert main(["report", str(out)]) == 0  # snip report renders a compare directory
    assert "Paired comparison against bf16" in (out / "report.html").read_text()
    # finished arms are never rerun: a second call trains nothing and gives the same table
    before = (out / "compare.json").read_text()
    assert main(argv) == 0
    assert "done earlier" in capsys.readouterr().out
    assert (out / "compare.json").read_text() == before


def test_interrupted_sweep_resumes(base: Path, tmp_path: Path, ctrl_c_after) -> None:
    from snip.compare import parse_arms

    sweep = Sweep(bases=(str(base),), arms=tuple(parse_arms(["bf16", "mxfp4"])), steps=4,
                  orders=1, reference="bf16", eval_batches=2, out=str(tmp_path / "cmp"),
                  threads=1)
    with ctrl_c_after(14):  # inside the first arm
        assert run_sweep(sweep, echo=lambda s: None) is Outcome.INTERRUPTED
    first = sweep.run_dir((0, 0), sweep.arms[0])
    assert not (first / "result.json").exists() and (first / "checkpoints").is_dir()
    lines: list[str] = []
    assert run_sweep(sweep, echo=lines.append) is Outcome.FINISHED
    assert len(lines) == 2 and all("val loss" in s for s in lines)
    assert json.loads((first / "result.json").read_text())["step"] == 16


def test_compare_bad_input(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                           tiny: dict) -> None:
    out = str(tmp_path / "cmp")
    common = ["--steps", "2", "--out", out]
    cases = [
        (["--base", str(base), "--arm", "bf16", "--arm", "fp9"], "not a preset"),
        (["--base", str(tmp_path), "--arm", "bf16"], "--base"),
        (["--base", str(base), "--arm", "bf16", "--reference", "fp4"], "not one of the arms"),
        (["--base", str(base)], "at least one --arm"),
        # a sweep's definition does not change when it is resumed or summarized
        (["--resume", str(tmp_path / "nothing")], "drop --steps (to change them"),
        (["--summarize", str(tmp_path / "x"), "--orders", "3", "--train.eval_batches", "5"],
         "drop --steps, --orders, --train.eval_batches"),
        (["--summarize", str(tmp_path / "x"), "--units", "-1"], "--units -1 must be >= 0"),
    ]
    for argv, message in cases:
        assert main(["compare", *argv, *common]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, (argv, err)
    assert main(["compare", "--resume", str(tmp_path / "nothing")]) == 2
    assert "holds no comparison" in capsys.readouterr().err
    (tmp_path / "afile").write_text("")
    assert main(["compare", "--base", str(base), "--arm", "bf16", "--steps", "2", "--out",
                 str(tmp_path / "afile")]) == 2
    assert "--out " + str(tmp_path / "afile") + " is a file; choose another --out" in \
        capsys.readouterr().err
    # a folder that is not a comparison (here a `snip report --out`) is not written into
    report = tmp_path / "report"
    report.mkdir()
    (report / "report.html").write_text("a report")
    assert main(["compare", "--base", str(base), "--arm", "bf16", "--steps", "2", "--out",
                 str(report)]) == 2
    assert "is not a snip compare sweep (it holds report.html)" in capsys.readouterr().err
    assert [p.name for p in report.iterdir()] == ["report.html"]
    assert (report / "report.html").read_text() == "a report"
    # bases of different model shapes
    train(from_sources(overrides={**tiny, "run.name": "other", "model.name": "small",
                                  "train.steps": 1}))
    other = Path(tiny["run.dir"]) / "other"
    assert main(["compare", "--base", str(base), "--base", str(other), "--arm", "bf16",
                 *common]) == 2
    assert "different shapes" in capsys.readouterr().err


def test_oracle_arm_added_to_a_finished_sweep(base: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cmp"
    common = ["compare", "--base", str(base), "--steps", "2", "--eval-batches", "2",
              "--precision.candidates", "bf16,fp4_e2m1_tensor", "--out", str(out), "--threads", "1",
              "--arm", "bf16", "--arm", "snip@0.75"]
    assert main(common) == 0
    capsys.readouterr()
    # the same definition with one more arm: finished arms stay, only the oracle trains
    assert main([*common, "--arm", "oracle@0.75"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("done earlier") == 2 and "oracle@0.75: val loss" in printed
    run = out / "runs" / "b0_o0" / "oracle@0.75"
    damage = json.loads((run / "sensitivity" / "step_12_damage.json").read_text())
    assert damage["low"] == "fp4_e2m1_tensor" and len(damage["values"]) > 1
    rows = {r["arm"]: r for r in json.loads((out / "compare.json").read_text())["rows"]["val_loss"]}
    assert rows["oracle@0.75"]["n"] == 1
    assert rows["oracle@0.75"]["fp4_flop_fraction"] == pytest.approx(
        rows["snip@0.75"]["fp4_flop_fraction"])  # held at the ILP's FP4 FLOPs
    # another definition (other steps) in the same directory is still refused
    assert main([*common[:4], "3", *common[5:]]) == 2
    assert "holds another comparison" in capsys.readouterr().err


def test_arm_major_schedule_leaves_whole_arms(tmp_path: Path) -> None:
    from snip.compare.sweep import schedule

    arms = tuple(parse_arms(["bf16", "random@0.5x2", "snip@0.5"]))
    sweep = Sweep(bases=("a", "b"), arms=arms, steps=1, orders=2, out=str(tmp_path))
    unit_major = schedule(sweep)
    assert [a.label for _, a in unit_major[:4]] == ["bf16", "random@0.5#0", "random@0.5#1",
                                                    "snip@0.5"]
    arm_major = schedule(sweep, arm_major=True)
    assert sorted(map(repr, arm_major)) == sorted(map(repr, unit_major))  # same branches
    labels = [a.label for _, a in arm_major]
    assert labels == [x for x in ("bf16", "snip@0.5", "random@0.5#0", "random@0.5#1")
                      for _ in range(4)]  # single arms first, every unit; then the draws
    assert [u for u, _ in arm_major[:4]] == sweep.units


def test_branch_claims_let_several_workers_share_a_sweep(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from snip.compare.sweep import claim, release

    run = tmp_path / "runs" / "b0_o0" / "bf16"
    assert claim(run) and claim(run)  # this process: claimed (and re-claimable by itself)
    assert json.loads((run / ".claim").read_text())["pid"] == os.getpid()
    child = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                            "from snip.compare.sweep import claim; "
                            f"sys.exit(0 if claim(Path({str(run)!r})) else 3)"],
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert child.returncode == 3  # another live process holds it
    release(run)
    assert not (run / ".claim").exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (run / ".claim").write_text(dead)  # a worker that died: its claim is taken over
    assert claim(run) and json.loads((run / ".claim").read_text())["pid"] == os.getpid()
    release(run)


def test_random_family_mean_uses_the_draws_finished_on_every_unit(tmp_path: Path) -> None:
    from snip.compare import summarize

    arms = tuple(parse_arms(["bf16", "random@0.5x3"]))
    sweep = Sweep(bases=("a", "b"), arms=arms, steps=1, orders=2, out=str(tmp_path))
    loss = {"bf16": 2.0, "random@0.5#0": 2.1, "random@0.5#1": 2.3, "random@0.5#2": 9.0}
    for unit in sweep.units:
        for arm in arms:
            if arm.label == "random@0.5#2" and unit != (0, 0):
                continue  # the third draw finished on one unit only
            run = sweep.run_dir(unit, arm)
            run.mkdir(parents=True)
            (run / "result.json").write_text(json.dumps(
                {"val_loss": loss[arm.label] + unit[1] / 10, "fp4_flop_fraction": 0.5,
                 "val_loss_hp": loss[arm.label] + unit[1] / 10}))
    rows = {r["arm"]: r for r in summarize(sweep).rows["val_loss_hp"]}
    fam = rows["random@0.5 (mean of 2)"]
    assert fam["n"] == 4 and fam["diff"] == pytest.approx(0.2)
    assert rows["random@0.5#2"]["n"] == 1


def test_a_new_comparison_may_use_an_empty_folder_or_its_own(tmp_path: Path) -> None:
    from snip.compare.sweep import HYPOTHESES_FILE, SWEEP_FILE, check_new_out

    out = tmp_path / "cmp"
    check_new_out(out)  # not there yet
    out.mkdir()
    check_new_out(out)  # empty
    (out / HYPOTHESES_FILE).write_text("{}")
    check_new_out(out)  # kept by a start that stopped before its definition was saved
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="holds notes.txt"):
        check_new_out(out)
    (out / SWEEP_FILE).write_text("{}")
    check_new_out(out)  # a comparison's own folder: rerun, resume or extend it


def test_bad_hypotheses_are_refused_before_anything_trains(base: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """A hypotheses file is checked (its shape, its arms) before the first branch trains and
    kept only when the sweep starts: a bad one never locks a sweep out of its results."""
    out = tmp_path / "cmp"
    common = ["compare", "--base", str(base), "--arm", "bf16", "--arm", "mxfp4", "--steps", "2",
              "--train.eval_batches", "2", "--out", str(out)]
    good = {"delta_min": 0.01, "hypotheses": [{"id": "h", "statement": "s",
                                               "contrasts": [["mxfp4", "bf16"]]}]}
    cases = [(json.dumps([1, 2]), "must hold a JSON object, not list"),
             (b"\xff\xfe{", "not UTF-8 text"),
             (json.dumps({**good, "delta_min": -1}), "delta_min must be a number of nats > 0"),
             (json.dumps({"delta_min": 0.01, "hypotheses": {"id": "h"}}), "must be a list"),
             (json.dumps({"delta_min": 0.01, "hypotheses": [{"id": "h", "statement": "s",
                                                             "contrasts": [["mxfp4", "nope"]]}]}),
              "hypothesis h names 'nope', which is not an arm")]
    hyp = tmp_path / "h.json"
    for text, message in cases:
        hyp.write_bytes(text if isinstance(text, bytes) else text.encode())
        assert main([*common, "--hypotheses", str(hyp)]) == 2, message
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, (message, err)
        assert not out.exists()  # nothing trained, nothing kept
    # a start that fails on its arms keeps no hypotheses either
    plan = tmp_path / "bad_plan.json"
    plan.write_text(json.dumps({"version": 1, "default": {"fprop": "bf16", "dgrad": "bf16",
                                                          "wgrad": "bf16"},
                                "layers": {"no.such.layer": {"fprop": "bf16", "dgrad": "bf16",
                                                             "wgrad": "bf16"}}}))
    hyp.write_text(json.dumps(good))
    assert main([*common, "--arm", f"x=plan:{plan}", "--hypotheses", str(hyp)]) == 2
    capsys.readouterr()
    assert not (out / "hypotheses.json").exists()
