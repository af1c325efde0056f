"""``snip plan --table``: planning from a measured table, train-style option names, warnings.

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by."""

from __future__ import annotations

import json

import pytest

from snip.cli import main
from snip.plan import PrecisionPlan
from snip.planner import build_problem, measure_damage, solution
from snip.sensitivity import synthetic_table

TWO = ("fp8_e4m3_tile128", "fp4_e2m1_tile128")
FOUR = ("bf16", "mxfp8_e4m3", "mxfp4", "nvfp4")


@pytest.fixture
def table_file(tmp_path):
    path = tmp_path / "sens.json"
    synthetic_table(4, TWO, seed=1).to_json(path)
    return path


def test_plan_from_table_every_method_matches_the_ilp(table_file, tmp_path, capsys) -> None:
    ilp = solution(synthetic_table(4, TWO, seed=1), 0.8)
    for m in ("ilp", "layer_id", "layer_type", "min_rel_err", "random"):
        out = tmp_path / f"{m}.json"
        assert main(["plan", "--table", str(table_file), "--precision.budget", "0.8",
                     "--precision.method", m, "--precision.seed", "3", "--out", str(out)]) == 0
        plan = PrecisionPlan.from_json(out)
        assert plan.meta["achieved"]["fp4_flop_fraction"] == pytest.approx(
            ilp.achieved.fp4_flop_fraction)
        assert plan.meta["table"] == str(table_file)
    assert "held at the ILP's" in capsys.readouterr().out


def test_train_style_names(table_file, tmp_path) -> None:
    out = tmp_path / "p.json"
    assert main(["plan", "--table", str(table_file), "--precision.per_gemm", "true",
                 "--precision.candidates", *TWO, "--out", str(out)]) == 0
    assert PrecisionPlan.from_json(out).meta["per_gemm"] is True
    assert main(["plan", "--table", str(table_file), "--precision.per_gemm", "false",
                 "--out", str(out)]) == 0
    assert PrecisionPlan.from_json(out).meta["per_gemm"] is False


def test_warnings(tmp_path, capsys) -> None:
    path = tmp_path / "four.json"
    synthetic_table(2, FOUR, seed=0).to_json(path)
    assert main(["plan", "--table", str(path), "--budget", "0.5", "--out",
                 str(tmp_path / "p.json")]) == 0
    err = capsys.readouterr().err
    assert "candidate mxfp8_e4m3 can never be chosen" in err  # bf16 beats it on an FP4 budget
    assert main(["plan", "--table", str(path), "--budget", "0.5", "--method", "uniform",
                 "--candidates", "bf16", "nvfp4", "--out", str(tmp_path / "u.json")]) == 0
    assert "exceeds the budget 0.5" in capsys.readouterr().err
    # the list as NAME,NAME, as train and compare take it: the same plan
    assert main(["plan", "--table", str(path), "--budget", "0.5", "--method", "uniform",
                 "--precision.candidates", "bf16,nvfp4", "--out", str(tmp_path / "v.json")]) == 0
    u, v = (json.loads((tmp_path / f).read_text()) for f in ("u.json", "v.json"))
    assert v["layers"] == u["layers"] and v["meta"]["candidates"] == ["bf16", "nvfp4"]


def test_oracle_from_damage_file(table_file, tmp_path) -> None:
    table = synthetic_table(4, TWO, seed=1)
    units = build_problem(table, 0.5).units
    rank = {n: i for i, (n, _) in enumerate(units)}
    d = measure_damage(table.layers, lambda plan: sum(
        rank[n] * (e["fprop"] == TWO[1]) for n, e in plan.layers.items()), high=TWO[0], low=TWO[1])
    (tmp_path / "d.json").write_text(json.dumps(d.to_dict()))
    out = tmp_path / "o.json"
    assert main(["plan", "--table", str(table_file), "--method", "oracle", "--damage",
                 str(tmp_path / "d.json"), "--out", str(out)]) == 0
    assert PrecisionPlan.from_json(out).meta["method"] == "oracle"


@pytest.mark.parametrize("argv, msg", [
    ([], "give --checkpoint"),
    (["--method", "oracle"], "needs --damage"),
])
def test_errors(table_file, tmp_path, capsys, argv, msg) -> None:
    if argv:
        argv = ["--table", str(table_file), *argv]
    assert main(["plan", *argv, "--out", str(tmp_path / "p.json")]) == 2
    assert msg in capsys.readouterr().err


def test_help_lists_methods_and_profiles(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for word in ("blackwell_ultra", "hopper", "layer_type:", "oracle:", "random baseline's draw"):
        assert word in text


def test_outputs_never_land_in_a_run_or_on_an_input(table_file, tmp_path, capsys) -> None:
    """A plan or table written over a run's ``config.toml`` or ``metrics.jsonl`` lost the run;
    one written over its own ``--table`` lost the measurement.  Refused before any work."""
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_000004"
    ckpt.mkdir(parents=True)
    (run / "config.toml").write_text("seed = 1\n")
    (run / "metrics.jsonl").write_text("{}\n")
    (ckpt / "meta.json").write_text("{}")
    (ckpt / "config.toml").write_text("seed = 1\n")
    sweep = tmp_path / "cmp"
    (sweep / "runs").mkdir(parents=True)
    (sweep / "sweep.json").write_text("{}")
    snapshot = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    table, other = ["--table", str(table_file)], str(tmp_path / "p.json")
    for argv, msg in [
        ([*table, "--out", str(run / "config.toml")], f"--out {run}/config.toml is or lies "
                                                      f"inside the run {run}"),
        ([*table, "--out", other, "--save-table", str(run / "metrics.jsonl")], "inside the run"),
        ([*table, "--out", str(ckpt / "p.json")], f"inside the checkpoint {ckpt}"),
        ([*table, "--out", str(sweep / "p.json")], "inside the snip compare sweep"),
        (["--checkpoint", str(run), "--table", str(run / "t.json"), "--out", other],
         "--table"),  # with --checkpoint, --table is where the measured table goes
        ([*table, "--out", str(table_file)], "is also --table"),
        ([*table, "--out", other, "--save-table", other], "--save-table"),
        ([*table, "--method", "oracle", "--damage", other, "--out", other], "is also --damage"),
    ]:
        assert main(["plan", *argv]) == 2, argv
        assert msg in capsys.readouterr().err, argv
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == snapshot


def test_a_malformed_table_is_one_line(table_file, tmp_path, capsys) -> None:
    """A plan passed as --table, or a table with a field missing or mistyped: one line, exit 2
    (they were KeyError, ValueError and AttributeError tracebacks)."""
    assert main(["plan", "--table", str(table_file), "--out", str(tmp_path / "plan.json")]) == 0
    table = json.loads(table_file.read_text())
    first = next(iter(table["layers"]))
    broken = {"plan": json.loads((tmp_path / "plan.json").read_text()),
              "no_candidates": {k: v for k, v in table.items() if k != "candidates"},
              "tokens": {**table, "tokens": "abc"},
              "layers_list": {**table, "layers": list(table["layers"])},
              "metrics_list": {**table, "layers": {**table["layers"], first: {
                  **table["layers"][first], "metrics": {g: [] for g in ("fprop", "dgrad",
                                                                        "wgrad")}}}}}
    capsys.readouterr()
    for name, d in broken.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(d))
        assert main(["plan", "--table", str(path), "--out", str(tmp_path / "x.json")]) == 2, name
        err = capsys.readouterr().err.strip()
        assert ("not a sensitivity table" in err or "is malformed" in err or "version" in err) \
            and "\n" not in err, (name, err)
    assert not (tmp_path / "x.json").exists()
