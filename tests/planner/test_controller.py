"""Controller protocol and ``snip plan`` errors."""

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
    ctl = Controller(budget=0.5, every=2, warmup=1, micro_batches=1, out_dir=tmp_path / "sens",
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
    lines = (tmp_path / "sens" / "controller.jsonl").read_text().splitlines()
    assert len(lines) == 2 and 0 <= json.loads(lines[-1])["overhead_share"] <= 1
    state = ctl.state_dict()
    again = Controller(budget=0.5, every=2)
    again.load_state_dict(state)
    assert again.history == ctl.history


@pytest.mark.parametrize("every", [0, -3])
def test_every_must_be_positive(every: int) -> None:
    with pytest.raises(ValueError, match="precision.every"):
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
                 "--micro-batches", "1", "--out", str(out), "--table", str(table)]) == 0
    plan = PrecisionPlan.from_json(out)
    assert plan.meta["achieved"]["fp4_flop_fraction"] >= 0.5
    assert plan.meta["per_gemm"] is True and table.is_file()


def test_cli_plan_refuses_checkpoint_without_optimizer_state(tiny_run, tmp_path,
                                                             capsys) -> None:
    import shutil

    copy = tmp_path / "r"
    shutil.copytree(tiny_run, copy)
    for f in (copy / "checkpoints").glob("step_*/optimizer.pt"):
        f.unlink()
    assert main(["plan", "--checkpoint", str(copy), "--out", str(tmp_path / "p.json")]) == 2
    assert "no optimizer state" in capsys.readouterr().err
