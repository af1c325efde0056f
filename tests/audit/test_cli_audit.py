"""``snip audit`` end to end on a few steps of the tiny model."""

from __future__ import annotations

import json
import re

import pytest

from snip.cli import build_parser, main


def test_snip_audit_records_plots_and_masks(tmp_path, capsys):
    out = tmp_path / "audit"
    mask = out / "mask.json"
    rc = main(["audit", "--out", str(out), "--steps", "4", "--batch", "2", "--seq-len", "16",
               "--formats", "e4m3", "--tile-size", "64", "--mask-out", "mask.json",
               "--threads", "1"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    fc = summary["formats"]["e4m3"]["forecast_total"]
    # e4m3 scale-1 storage at lr 1e-3: a majority frozen within the first steps, as forecast
    assert fc["measured"] is not None and fc["measured"] <= 3
    assert fc["predicted"] == fc["measured"]
    assert (out / "frozen_e4m3.png").stat().st_size > 1000
    m = json.loads(mask.read_text())
    assert m["budget"] == round(0.1 * m["eligible"])
    # the plain-language summary, with the numbers of summary.json, and the files written
    text = capsys.readouterr().out.splitlines()
    line = next(x for x in text if x.startswith("e4m3, round to nearest: "))
    val = summary["val_loss"]
    assert f"majority frozen from step {fc['measured']} (forecast: step {fc['predicted']})" in line
    assert f"validation loss fp32 {val['fp32']:.2f} vs e4m3 {val['e4m3']:.2f}" in line
    assert "% of weights never moved" in line
    # every output, the mask included, is under --out, and the last line names each file
    assert text[-1].startswith("wrote ") and str(mask) in text[-1]
    files = {p for p in out.iterdir() if p.is_file() and p.name != ".lock"}  # (its lock)
    assert files == {out / "summary.json", out / "trace.npz", out / "frozen_e4m3.png", mask}
    for f in files:
        assert str(f) in text[-1]
    assert f"{out / 'reference'}/" in text[-1] and f"{out / 'measured_e4m3'}/" in text[-1]
    assert {p for p in tmp_path.iterdir()} == {out}  # nothing outside --out
    assert summary["mask"]["path"] == str(mask)
    # the runs behind it are ordinary run directories of the trainer
    assert (out / "reference" / "metrics.jsonl").is_file()
    assert (out / "measured_e4m3" / "config.toml").is_file()
    rc = main(["audit", "--trace", str(out / "trace.npz"), "--out", str(tmp_path / "b"),
               "--no-measure"])
    assert rc == 0
    assert "(forecast; not measured)" in capsys.readouterr().out
    # a rerun into the same --out without --mask-out: the earlier mask stays (a training run
    # may name it), and the output says it is not this audit's
    assert main(["audit", "--trace", str(out / "trace.npz"), "--out", str(out),
                 "--no-measure"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[-2] == (f"note: {out / 'reference'}/, {out / 'measured_e4m3'}/, {mask} left from "
                        f"an earlier audit in {out} (not this one's outputs)")
    assert str(mask) not in text[-1] and mask.is_file()
    assert "run directories" not in text[-1]  # it trained none


def test_snip_audit_bad_trace_is_a_user_error(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["audit", "--trace", str(tmp_path / "nope.npz"), "--out", str(out)]) == 2
    assert not out.exists()  # a bad input writes nothing
    err = capsys.readouterr().err
    assert "does not exist" in err
    # the command it suggests for recording a trace takes only flags snip audit has
    suggested = re.search(r"`snip audit ([^`]*)`", err).group(1)
    assert "--out" in suggested
    build_parser(["audit"]).parse_args(["audit", *suggested.split()])


def test_snip_audit_unknown_format_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["audit", "--out", str(out), "--train.steps", "2", "--formats", "E4M3", "e9m9x"]
    assert main(argv) == 2
    assert not out.exists()  # refused before the reference run starts
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown element format 'e9m9x'" in err[0]


def test_snip_audit_out_never_inside_a_run(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.toml").write_text("seed = 1\n")
    for out in (run, run / "audit"):
        assert main(["audit", "--out", str(out), "--train.steps", "2"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is or lies inside the run {run}" in err[0]
    assert sorted(p.name for p in run.rglob("*")) == ["checkpoints", "config.toml"]


@pytest.mark.parametrize("name", ["sub/mask.json", "/tmp/mask.json", "..", "./m.json"])
def test_snip_audit_mask_out_is_a_file_name_under_out(tmp_path, capsys, name):
    out = tmp_path / "out"
    assert main(["audit", "--out", str(out), "--mask-out", name, "--train.steps", "2"]) == 2
    assert not out.exists()  # refused before anything is written
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--mask-out takes a file name, written under --out" in err[0]


def test_snip_audit_with_a_runs_settings(tmp_path, tiny):
    """--run RUN audits with the run's own model, data, optimizer, schedule and seed (from
    scratch); --run CHECKPOINT continues that run from the checkpoint."""
    import tomllib

    from snip.train import from_sources, train

    overrides = {**tiny, "train.lr": 2e-3, "seed": 7, "precision.preset": "bf16"}
    train(from_sources(overrides=overrides))
    run = tmp_path / "runs" / "tiny"
    out = tmp_path / "audit"
    assert main(["audit", "--run", str(run), "--out", str(out), "--formats", "e4m3",
                 "--tile-size", "64", "--threads", "1"]) == 0
    ref = tomllib.loads((out / "reference" / "config.toml").read_text())
    mine = tomllib.loads((run / "config.toml").read_text())
    for section, key in (("model", "name"), ("data", "path"), ("train", "lr"),
                         ("train", "steps"), ("train", "batch_size"), ("precision", "preset")):
        assert ref[section][key] == mine[section][key], (section, key)
    assert ref["seed"] == 7 and ref["writeback"]["policy"] == "none"
    meas = tomllib.loads((out / "measured_e4m3" / "config.toml").read_text())
    assert meas["writeback"]["policy"] == "rne" and meas["writeback"]["format"] == "e4m3"
    # from a checkpoint: the rest of the run's schedule, starting at its step
    ckpt = run / "checkpoints" / "step_000006"
    assert main(["audit", "--run", str(ckpt), "--out", str(tmp_path / "b"), "--formats",
                 "e4m3", "--tile-size", "64", "--threads", "1"]) == 0
    events = [json.loads(x) for x in
              (tmp_path / "b" / "reference" / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "train"] == list(range(7, 13))
    assert main(["audit", "--run", str(tmp_path), "--out", str(tmp_path / "c")]) == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--train.steps", "0"], "--train.steps 0 must be >= 1"),
    (["--tile-size", "0"], "--tile-size 0 must be >= 1"),
    (["--tile-size", "-1"], "--tile-size -1 must be >= 1"),
    (["--every", "0"], "--every 0 must be >= 1"),
    (["--score-steps", "-1"], "--score-steps -1 must be >= 0"),
    (["--mask-fraction", "2", "--mask-out", "m.json"], "--mask-fraction 2.0 must lie in [0, 1]"),
    (["--every", "10"], "--every 10 is more than the 5 steps the audit trains"),
])
def test_snip_audit_bad_numbers_write_nothing(tmp_path, capsys, argv, message):
    """Refused before the reference run starts (they crashed, or were refused, after it)."""
    out = tmp_path / "out"
    assert main(["audit", "--out", str(out), "--train.steps", "5", *argv]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_snip_audit_stops_at_ctrl_c_and_summarizes_nothing(tmp_path, capsys, ctrl_c_after):
    """An interrupted run would be compared with whole ones: the audit ends there, exit 130."""
    out = tmp_path / "out"
    with ctrl_c_after(2):
        rc = main(["audit", "--out", str(out), "--train.steps", "6", "--train.batch_size", "2",
                   "--train.seq_len", "16", "--formats", "e4m3", "--train.threads", "1"])
    assert rc == 130
    assert f"interrupted in {out / 'reference'}; nothing summarized" in capsys.readouterr().err
    assert not (out / "measured_e4m3").exists()
    assert {p.name for p in out.iterdir()} == {".lock", "reference"}  # no trace, plot, summary


def test_snip_audit_out_is_one_audits_at_a_time(tmp_path, capsys):
    from snip.train.rundir import RunLock

    out = tmp_path / "out"
    with RunLock(out):  # another audit writing there
        assert main(["audit", "--out", str(out), "--train.steps", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "in use by another snip process" in err[0]
    assert err[0].endswith("choose another --out") and [p.name for p in out.iterdir()] == [".lock"]
    (tmp_path / "file").write_text("")
    assert main(["audit", "--out", str(tmp_path / "file" / "out"), "--train.steps", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "file" in err[0], err  # one line, not an OSError's traceback


def test_an_earlier_audits_outputs_are_read_from_its_summary(tmp_path):
    from snip.cli.audit import _earlier_outputs

    assert _earlier_outputs(tmp_path) == []  # none there
    (tmp_path / "summary.json").write_text(json.dumps(
        {"formats": {"e4m3": {}, "e5m2": {}}, "mask": {"path": str(tmp_path / "m.json")}}))
    assert _earlier_outputs(tmp_path) == ["frozen_e4m3.png", "frozen_e5m2.png", "reference/",
                                          "measured_e4m3/", "measured_e5m2/", "m.json"]
    (tmp_path / "summary.json").write_text("[1]")
    assert _earlier_outputs(tmp_path) == []


def test_snip_audit_of_a_finished_checkpoint_says_what_to_pass(tmp_path, tiny, capsys):
    from snip.train import from_sources, train

    train(from_sources(overrides={**tiny, "train.steps": 2, "train.ckpt_every": 2,
                                  "precision.preset": "bf16"}))
    capsys.readouterr()
    last = tmp_path / "runs" / "tiny" / "checkpoints" / "step_000002"
    out = tmp_path / "out"
    assert main(["audit", "--run", str(last), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is at the end of its schedule" in err[0], err  # not "lower --every"
    assert "--train.steps N" in err[0] and not out.exists()
