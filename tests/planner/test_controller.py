"""Controller protocol and ``snip plan`` errors.

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by.  The oracle's
damage (``abs=1e-6``) is two fp32 losses of the same model subtracted: the same computation twice,
so it agrees to the last bit on one machine and to fp32 rounding of a loss (~1e-7) anywhere."""

from __future__ import annotations

import json

import pytest
import torch

from snip.cli import main
from snip.models import build_model, get_config
from snip.plan import PrecisionPlan
from snip.planner import Controller


def batch_fn(i: int):
    g = torch.Generator().manual_seed(i)
    x = torch.randint(0, 256, (2, 32), generator=g)
    return x, torch.roll(x, -1, 1)


def test_controller_warmup_cadence_and_files(tmp_path) -> None:
    torch.manual_seed(0)
    m = build_model(get_config("tiny", n_layers=1, max_seq_len=32))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ctl = Controller(budget=0.5, every=2, warmup=1, calib_batches=1, out_dir=tmp_path / "sens",
                     plans_dir=tmp_path / "plans")
    got = {}
    for step in range(1, 5):
        _, loss = m(*batch_fn(step))
        loss.backward()
        opt.step()
        opt.zero_grad()
        got[step] = ctl.on_step_end(step, m, opt, batch_fn)
    assert [s for s, p in got.items() if p is not None] == [1, 3]
    plan = got[3]
    assert isinstance(plan, PrecisionPlan)
    assert plan.meta["achieved"]["fp4_flop_fraction"] >= 0.5
    assert (tmp_path / "sens" / "step_3.json").is_file()
    assert (tmp_path / "plans" / "step_1.json").is_file()
    assert (tmp_path / "sens" / "step_3_cycle.json").is_file()
    lines = (tmp_path / "sens" / "controller.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    assert len(lines) == 2 and 0 <= last["overhead_share"] <= 1
    assert last["cycle_step_equivalents"] > 0 and last["step_seconds_source"] == "median_interval"
    assert json.loads(lines[0])["step_seconds_source"] == "clean_pass"  # no interval at step 1
    assert ctl.history[-1].step_equivalents == pytest.approx(last["cycle_step_equivalents"])
    state = ctl.state_dict()
    again = Controller(budget=0.5, every=2)
    again.load_state_dict(state)
    assert again.history == ctl.history
    assert again.ema.to_dict() == ctl.ema.to_dict()  # the averaged table travels


@pytest.mark.parametrize("every", [0, -3])
def test_every_must_be_positive(every: int) -> None:
    with pytest.raises(ValueError, match="every="):
        Controller(every=every)


def test_cli_plan_missing_checkpoint(tmp_path, capsys) -> None:
    assert main(["plan", "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_plan_checkpoint_without_optimizer(tmp_path, capsys) -> None:
    ck = tmp_path / "run" / "checkpoints" / "step_000010"
    ck.mkdir(parents=True)
    (ck / "meta.json").write_text("{}")
    assert main(["plan", "--checkpoint", str(tmp_path / "run"), "--budget", "0.75"]) == 2
    err = capsys.readouterr().err
    assert "no optimizer state" in err and "optimizer.pt" in err


def test_cli_plan_bad_budget(tmp_path, capsys) -> None:
    assert main(["plan", "--checkpoint", str(tmp_path), "--budget", "1.5"]) == 2
    assert "[0, 1]" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from snip.train import from_sources, train

    root = tmp_path_factory.mktemp("runs")
    cfg = from_sources(overrides={
        "model.name": "tiny", "train.steps": 2, "train.batch_size": 2, "train.seq_len": 32,
        "train.eval_every": 2, "train.eval_batches": 1, "train.ckpt_every": 2,
        "train.warmup_steps": 1, "run.dir": str(root), "run.name": "r",
        "precision.preset": "bf16"})
    return train(cfg).run_dir


def test_cli_plan_from_checkpoint(tiny_run, tmp_path) -> None:
    out, table = tmp_path / "plan.json", tmp_path / "t.json"
    assert main(["plan", "--checkpoint", str(tiny_run), "--budget", "0.5", "--per-gemm",
                 "--precision.calib_batches", "1", "--out", str(out), "--table", str(table)]) == 0
    plan = PrecisionPlan.from_json(out)
    assert plan.meta["achieved"]["fp4_flop_fraction"] >= 0.5
    assert plan.meta["per_gemm"] is True and table.is_file()


def test_cli_plan_measures_what_the_runs_controller_measures(tiny_run, tmp_path,
                                                              capsys) -> None:
    """One name and one default per concept: without flags `snip plan` uses the run's
    precision.calib_batches / calib_rows (1 and 2 by default); the flags override them, and
    the old --micro-batches spelling still works with a deprecation line."""
    from snip.sensitivity import SensitivityTable

    def measured(*flags: str) -> dict:
        table = tmp_path / "t.json"
        assert main(["plan", "--checkpoint", str(tiny_run), "--out", str(tmp_path / "p.json"),
                     "--save-table", str(table), *flags]) == 0
        return SensitivityTable.from_json(table).meta

    meta = measured()
    assert (meta["calib_batches"], meta["calib_rows"]) == (1, 2)
    meta = measured("--precision.calib_batches", "2", "--precision.calib_rows", "0")
    assert (meta["calib_batches"], meta["calib_rows"]) == (2, None)
    capsys.readouterr()
    assert measured("--micro-batches", "3")["calib_batches"] == 3
    assert "--micro-batches is deprecated, use --precision.calib_batches" in \
        capsys.readouterr().err
    assert main(["plan", "--checkpoint", str(tiny_run), "--precision.calib_rows", "-1"]) == 2


def test_cli_plan_refuses_checkpoint_without_optimizer_state(tiny_run, tmp_path,
                                                             capsys) -> None:
    import shutil

    copy = tmp_path / "r"
    shutil.copytree(tiny_run, copy)
    for f in (copy / "checkpoints").glob("step_*/optimizer.pt"):
        f.unlink()
    assert main(["plan", "--checkpoint", str(copy), "--out", str(tmp_path / "p.json")]) == 2
    assert "no optimizer state" in capsys.readouterr().err


def _train(model, opt, steps, ctl, batch_fn, start: int = 1) -> dict:
    plans = {}
    for step in range(start, start + steps):
        _, loss = model(*batch_fn(1000 + step))
        loss.backward()
        opt.step()
        opt.zero_grad()
        plan = ctl.on_step_end(step, model, opt, batch_fn)
        if plan is not None:
            plans[step] = plan
    return plans


def _tiny():
    torch.manual_seed(0)
    m = build_model(get_config("tiny", n_layers=1, max_seq_len=32))
    return m, torch.optim.AdamW(m.parameters(), lr=3e-3)


def test_fresh_calibration_batches_and_ema() -> None:
    seen: list[int] = []

    def recording(i: int):
        if i < 1000:
            seen.append(i)
        return batch_fn(i)

    m, opt = _tiny()
    ctl = Controller(budget=0.5, every=2, warmup=1, calib_batches=2, ema_decay=0.5)
    _train(m, opt, 5, ctl, recording)
    assert seen == [0, 1, 2, 3, 4, 5]  # cycles at steps 1, 3, 5; never the same batch twice
    assert [c.batch_offset for c in ctl.history] == [0, 2, 4]
    assert ctl.ema.meta["ema"]["cycles"] == 3


def test_resume_replans_identically() -> None:
    import copy

    m, opt = _tiny()
    ctl = Controller(budget=0.5, every=2, warmup=1, method="ilp")
    _train(m, opt, 3, ctl, batch_fn)
    saved = copy.deepcopy((m.state_dict(), opt.state_dict(), ctl.state_dict()))
    full = _train(m, opt, 4, ctl, batch_fn, start=4)
    m2, opt2 = _tiny()
    m2.load_state_dict(saved[0])
    opt2.load_state_dict(saved[1])
    resumed = Controller(budget=0.5, every=2, warmup=1, method="ilp")
    resumed.load_state_dict(saved[2])
    again = _train(m2, opt2, 4, resumed, batch_fn, start=4)
    assert list(full) == list(again) == [5, 7]
    for step in full:
        assert full[step].layers == again[step].layers
    assert resumed.ema.to_dict()["layers"] == ctl.ema.to_dict()["layers"]


def test_random_baseline_is_one_fixed_plan_per_seed() -> None:
    m, opt = _tiny()
    plans = _train(m, opt, 5, Controller(budget=0.5, every=2, warmup=1, method="random",
                                         seed=7), batch_fn)
    layers = [p.layers for p in plans.values()]
    assert len(layers) == 3 and all(x == layers[0] for x in layers)


def test_plans_run_their_gemms_as_the_run_does() -> None:
    """The controller's plans are complete: a native run stays native across re-plans."""
    from snip.nn import GemmImpl

    for gemm in (GemmImpl.EMULATED, GemmImpl.NATIVE):
        m, opt = _tiny()
        plans = _train(m, opt, 3, Controller(budget=0.5, every=2, warmup=1, gemm=gemm.value),
                       batch_fn)
        assert len(plans) == 2 and all(p.gemm is gemm for p in plans.values())
        assert plans[1].meta["achieved"]["fp4_flop_fraction"] >= 0.5


def test_controller_validates_its_knobs() -> None:
    with pytest.raises(ValueError, match="calib_batches"):
        Controller(calib_batches=0)
    with pytest.raises(ValueError, match="ema_decay"):
        Controller(ema_decay=1.0)
    with pytest.raises(ValueError, match="warmup="):
        Controller(warmup=0)


def test_hugging_face_model_measures_and_plans() -> None:
    pytest.importorskip("transformers")
    from snip.models.hf import tiny_hf_model

    model = tiny_hf_model("llama")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = batch_fn(0)
    loss = torch.nn.functional.cross_entropy(model(input_ids=x).logits.flatten(0, 1),
                                             y.flatten() % model.config.vocab_size)
    loss.backward()
    opt.step()
    opt.zero_grad()

    def hf_batch(i: int):
        x, y = batch_fn(i)
        return x % model.config.vocab_size, y % model.config.vocab_size

    plan = Controller(budget=0.5, every=1, warmup=1).on_step_end(1, model, opt, hf_batch)
    assert plan is not None and plan.meta["achieved"]["fp4_flop_fraction"] >= 0.5
    assert any("q_proj" in n for n in plan.layers)


# -- the oracle arm: measured single-layer damage --------------------------------------------

ORACLE_PAIR = ("bf16", "fp4_e2m1_tensor")


def _tiny_converted():
    from snip.nn import convert

    m, _ = _tiny()
    convert(m, ORACLE_PAIR[0])
    return m, torch.optim.AdamW(m.parameters(), lr=3e-3)


def test_oracle_plan_is_the_knapsack_on_the_cycles_measured_damage(tmp_path) -> None:
    from snip.planner import Damage, solve
    from snip.planner.controller import oracle_damage
    from snip.sensitivity import SensitivityTable

    m, opt = _tiny_converted()
    ctl = Controller(budget=0.5, every=2, warmup=1, method="oracle", candidates=ORACLE_PAIR,
                     calib_batches=2, out_dir=tmp_path)
    plans = _train(m, opt, 3, ctl, batch_fn)
    assert list(plans) == [1, 3]
    damage = Damage.from_dict(json.loads((tmp_path / "step_3_damage.json").read_text()))
    layers = SensitivityTable.from_json(tmp_path / "step_3.json").names
    assert sorted(damage.values) == sorted(layers) and damage.low == ORACLE_PAIR[1]
    assert any(v != 0 for v in damage.values.values())
    # the same knapsack, solved as `snip plan --method oracle --damage` does, on the same table
    table = SensitivityTable.from_json(tmp_path / "step_3.json")
    again = solve(table, 0.5, method="oracle", candidates=ORACLE_PAIR, damage=damage)
    assert plans[3].layers == again.layers
    ilp = solve(table, 0.5, candidates=ORACLE_PAIR)
    assert plans[3].meta["achieved"]["fp4_flop_fraction"] == pytest.approx(
        ilp.meta["achieved"]["fp4_flop_fraction"])  # held at the ILP's FP4 FLOPs
    # the damage is the loss of each single-layer plan minus the all-high loss, on cycle 2's
    # batches (offset 2), deterministic, and the model's formats and counters are restored
    before = {n: (q.specs, q.step) for n, q in _qlinears(m)}
    d1 = oracle_damage(m, batch_fn, layers, high=ORACLE_PAIR[0], low=ORACLE_PAIR[1],
                       batch_offset=2, batches=2)
    assert {n: (q.specs, q.step) for n, q in _qlinears(m)} == before
    d2 = oracle_damage(m, batch_fn, layers, high=ORACLE_PAIR[0], low=ORACLE_PAIR[1],
                       batch_offset=2, batches=2)
    assert d1.to_dict() == d2.to_dict()
    name = layers[0]
    from snip.planner.oracle import single_unit_plan
    from snip.sensitivity.loss import default_loss

    def loss(plan) -> float:
        plan.apply(m)
        with torch.no_grad():
            return sum(float(default_loss(m, batch_fn(2 + i))) for i in range(2)) / 2

    m.eval()
    high = loss(single_unit_plan(layers, *ORACLE_PAIR, None))
    one = loss(single_unit_plan(layers, *ORACLE_PAIR, (name, ("fprop", "dgrad", "wgrad"))))
    for n, q in _qlinears(m):
        q.set_specs(before[n][0])
    m.train()
    assert d1.values[name] == pytest.approx(one - high, abs=1e-6)


def _qlinears(m):
    from snip.nn import qlinear_layers

    return qlinear_layers(m)


def test_oracle_bad_input() -> None:
    with pytest.raises(ValueError, match="per layer"):
        Controller(method="oracle", per_gemm=True, candidates=ORACLE_PAIR)
    with pytest.raises(ValueError, match="exactly two candidates"):
        Controller(method="oracle", candidates=("bf16", "fp8_e4m3_tile128", "fp4_e2m1_tensor"))
    m, opt = _tiny()  # not converted: the oracle cannot switch its layers
    ctl = Controller(budget=0.5, every=2, warmup=1, method="oracle", candidates=ORACLE_PAIR)
    with pytest.raises(ValueError, match="not a converted"):
        _train(m, opt, 1, ctl, batch_fn)
