"""Fault injection, round two (issue 23): no command destroys a run, an interrupted sweep never
records a result it does not have, and outputs are written atomically.

Each test reproduces one case of the reliability review (docs: README "Reliability") that used
to lose data, record NaN, or leave a stuck state, and checks the fixed behaviour.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from snip import atomic
from snip.cli import main
from snip.errors import UserError
from snip.train import checkpoint, from_sources, train
from snip.train.metrics import read_metrics
from snip.train.rundir import RunLock


def _argv(settings: dict) -> list[str]:
    return [a for k, v in settings.items() for a in (f"--{k}", str(v))]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def _one_line(capsys: pytest.CaptureFixture) -> str:
    """The one line snip printed on stderr (progress bars of libraries aside)."""
    err = [x for x in capsys.readouterr().err.strip().splitlines()
           if x.startswith("snip ") and not x.startswith("snip train: warning:")]
    assert len(err) == 1, err
    return err[0]


@pytest.fixture
def run6(tiny: dict) -> Path:
    """A finished 6-step tiny run (checkpoint step_000006), bf16 (deterministic rounding)."""
    train(from_sources(overrides={**tiny, "train.steps": 6, "precision.preset": "bf16"}))
    return Path(tiny["run.dir"]) / "tiny"


# -- 1. snip audit never deletes a run it did not write -----------------------------------------

AUDIT = ["audit", "--model.name", "tiny", "--train.steps", "2", "--formats", "e4m3",
         "--no-measure", "--train.batch_size", "4", "--train.seq_len", "32",
         "--train.threads", "1"]


def test_audit_refuses_a_users_run_and_replaces_only_its_own(
        tiny: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "audit"
    train(from_sources(overrides={**tiny, "train.steps": 2, "run.dir": str(out),
                                  "run.name": "reference"}))
    before = _snapshot(out)
    assert main([*AUDIT, "--out", str(out)]) == 2
    assert "did not write" in _one_line(capsys)
    assert _snapshot(out) == before  # the user's checkpoints are all there

    own = tmp_path / "own"
    assert main([*AUDIT, "--out", str(own)]) == 0
    assert main([*AUDIT, "--out", str(own)]) == 0  # its own earlier run: replaced
    capsys.readouterr()
    with RunLock(own / "reference"):  # ... but never while it is in use
        assert main([*AUDIT, "--out", str(own)]) == 2
        assert "in use" in _one_line(capsys)
    assert checkpoint.list_checkpoints(own / "reference" / "checkpoints")


# -- 2. a stop on the final step is a finished run; a missing result is recomputed ---------------


def test_stop_on_the_last_step_finishes_and_resume_says_so(
        tiny: dict, ctrl_c_after, capsys: pytest.CaptureFixture) -> None:
    with ctrl_c_after(12):
        assert main(["train", *_argv(tiny)]) == 0  # not "interrupted": every step is done
    run = Path(tiny["run.dir"]) / "tiny"
    assert "val loss" in capsys.readouterr().out
    assert main(["train", "--resume", str(run)]) == 2
    assert "already at step 12" in _one_line(capsys)
    # a change --resume refuses is named first: more steps would not make it allowed
    assert main(["train", "--resume", str(run), "--train.lr", "0.5"]) == 2
    assert "--resume cannot change train.lr" in _one_line(capsys)
    assert main(["train", "--resume", str(run), "--train.steps", "8"]) == 2
    assert "below the step of checkpoint" in _one_line(capsys)
    assert main(["train", "--init-from", str(run), "--run.name", "b"]) == 2
    assert "parent is at step 12" in _one_line(capsys)


def test_compare_recomputes_a_missing_result_never_nan(
        run6: Path, tmp_path: Path, ctrl_c_after, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cmp"
    argv = ["compare", "--base", str(run6), "--arm", "bf16", "--steps", "2",
            "--train.eval_batches", "2", "--out", str(out), "--train.threads", "1"]
    with ctrl_c_after(8):  # Ctrl-C on the arm's last step
        assert main(argv) == 0
    result = out / "runs" / "b0_o0" / "bf16" / "result.json"
    first = json.loads(result.read_text())
    assert first["step"] == 8
    result.unlink()  # as a kill between the final checkpoint and result.json leaves it
    os.rename(out, tmp_path / "moved")  # a sweep is its directory, wherever it is now
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--resume", "moved"]) == 0
    out = tmp_path / "moved"
    result = out / "runs" / "b0_o0" / "bf16" / "result.json"
    again = json.loads(result.read_text())
    # the same weights, windows and deterministic (bf16 round-to-nearest) GEMMs, evaluated
    # by the same code in the same order: bitwise equal
    assert (again["val_loss"], again["val_loss_hp"]) == (first["val_loss"],
                                                         first["val_loss_hp"])
    capsys.readouterr()
    result.write_text("{torn")
    assert main(["compare", "--summarize", str(out)]) == 2
    assert "damaged" in _one_line(capsys)


# -- 3. a failed --resume changes nothing; train.threads is bounded -----------------------------


def test_failed_resume_leaves_the_run_as_it_was(
        run6: Path, tiny: dict, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    train(from_sources(resume=run6, overrides={"train.steps": 9}), resume=run6)
    before = _snapshot(run6)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # not installed
    step6 = run6 / "checkpoints" / "step_000006"
    assert main(["train", "--resume", str(step6), "--log.tensorboard", "true"]) == 2
    assert "tensorboard" in _one_line(capsys)
    assert main(["train", "--resume", str(step6), "--train.threads", "100000"]) == 2
    assert "train.threads" in _one_line(capsys)
    assert _snapshot(run6) == before
    fresh = Path(tiny["run.dir"]) / "fresh"
    assert main(["train", *_argv({**tiny, "run.name": "fresh"}), "--log.tensorboard",
                 "true"]) == 2
    assert not fresh.exists()


# -- 5. resuming an older checkpoint retires the newer ones --------------------------------------


def test_resume_from_an_older_checkpoint_keeps_one_timeline(
        tiny: dict, capsys: pytest.CaptureFixture) -> None:
    train(from_sources(overrides=tiny))  # checkpoints 6 and 12
    run = Path(tiny["run.dir"]) / "tiny"
    step6 = run / "checkpoints" / "step_000006"
    train(from_sources(resume=step6, overrides={"train.steps": 9}), resume=step6)
    assert "moved the newer checkpoint(s) step_000012" in capsys.readouterr().err
    assert [p.name for p in checkpoint.list_checkpoints(run / "checkpoints")] == [
        "step_000006", "step_000009"]
    (retired,) = (run / "retired").iterdir()
    assert checkpoint.load(retired / "step_000012").step == 12  # moved aside, not deleted
    train(from_sources(resume=run, overrides={"train.steps": 11}), resume=run)
    steps = [e["step"] for e in read_metrics(run / "metrics.jsonl") if e["event"] == "train"]
    assert steps == list(range(1, 12))  # one history: 1..9 then 10, 11
    history = checkpoint.load(checkpoint.find(run)).config_toml
    assert '"train.steps" = [12, 9]' in history and '"train.steps" = [9, 11]' in history


# -- 7. a fresh run never overwrites files in a directory ---------------------------------------


def test_a_fresh_run_refuses_a_non_empty_directory(tiny: dict,
                                                  capsys: pytest.CaptureFixture) -> None:
    run = Path(tiny["run.dir"]) / "tiny"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("precious\n")
    assert main(["train", *_argv(tiny)]) == 2
    assert "not empty" in _one_line(capsys)
    assert (run / "metrics.jsonl").read_text() == "precious\n"
    assert not (run / "config.toml").exists()


# -- 4 and 8. export: never over its source, whole or not at all ---------------------------------


def test_export_and_compare_refuse_runs_and_sweeps(run6: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    before = _snapshot(run6)
    ckpt = run6 / "checkpoints" / "step_000006"
    (tmp_path / "a_file").write_text("x")
    sweep = tmp_path / "cmp"  # another command's output: a snip compare sweep
    (sweep / "runs").mkdir(parents=True)
    (sweep / "sweep.json").write_text("{}")
    for out in (ckpt, ckpt / "sub", run6, run6 / "hf", run6.parent, tmp_path / "a_file",
                sweep / "hf"):
        assert main(["export", str(run6), "--out", str(out)]) == 2, out
        _one_line(capsys)
    assert not (sweep / "hf").exists()
    # snip compare: a sweep never goes into (or over) a run or checkpoint, or another sweep
    argv = ["compare", "--base", str(run6), "--arm", "bf16", "--steps", "1"]
    for out in (run6, ckpt / "cmp", sweep / "runs" / "x"):
        assert main([*argv, "--out", str(out)]) == 2, out
        assert "is or lies inside the" in _one_line(capsys)
    assert not any((sweep / "runs").iterdir())
    assert _snapshot(run6) == before


def test_owner_names_the_nearest_run_checkpoint_or_sweep(run6: Path, tmp_path: Path) -> None:
    ckpt = run6 / "checkpoints" / "step_000006"
    real = Path(os.path.realpath(run6))
    assert atomic.owner(run6) == (real, "run")
    assert atomic.owner(run6 / "not" / "yet" / "made.json") == (real, "run")
    assert atomic.owner(ckpt / "x") == (real / "checkpoints" / "step_000006", "checkpoint")
    link = tmp_path / "link"
    link.symlink_to(run6)  # the real path decides, not the spelling
    assert atomic.owner(link / "plan.json") == (real, "run")
    assert atomic.owner(tmp_path / "elsewhere.json") is None
    sweep = tmp_path / "cmp"
    (sweep / "runs" / "arm").mkdir(parents=True)
    (sweep / "sweep.json").write_text("{}")
    for name in ("metrics.jsonl", "config.toml"):
        (sweep / "runs" / "arm" / name).write_text("")
    assert atomic.owner(sweep / "runs" / "arm") == (Path(os.path.realpath(sweep)) / "runs" / "arm",
                                                    "run")  # the nearest one
    assert atomic.owner(sweep / "runs") == (Path(os.path.realpath(sweep)), "snip compare sweep")
    atomic.check_outside(sweep, "--out", own=atomic.owner(sweep))  # its own: no error
    with pytest.raises(UserError, match=f"--out {sweep} is or lies inside the snip compare"):
        atomic.check_outside(sweep, "--out")
    # one common file name alone is not a run, checkpoint or sweep (another tool's meta.json)
    for name in ("meta.json", "metrics.jsonl", "sweep.json", "config.toml"):
        (tmp_path / "home" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "home" / name).write_text("{}")
        assert atomic.owner(tmp_path / "home" / "plan.json") is None, name
        (tmp_path / "home" / name).unlink()


def test_export_is_atomic_and_cleans_up(run6: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    from snip.models import hf

    out = tmp_path / "hf"
    dead = tmp_path / f".hf{atomic.TMP}999999999"  # a killed export's temporary (no such pid)
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"0" * 100)
    assert main(["export", str(run6), "--out", str(out)]) == 0
    assert not dead.exists()
    good = _snapshot(out)
    real = hf.save_hf_llama

    def full_disk(model: torch.nn.Module, where: Path) -> Path:
        real(model, where)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hf, "save_hf_llama", full_disk)
    assert main(["export", str(run6), "--out", str(out)]) == 2
    assert "no space left on device" in _one_line(capsys)
    assert _snapshot(out) == good  # the earlier export is intact
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert main(["export", str(run6), "--out", str(tmp_path / "new")]) == 2
    assert not (tmp_path / "new").exists()


def test_atomic_write_keeps_the_old_file_and_leaves_no_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "step_5.json"
    path.write_text("old")
    stale = tmp_path / f".step_5.json{atomic.TMP}999999999"
    stale.write_text("torn")
    real = os.fsync

    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with pytest.raises(UserError, match="no space left on device"):
        atomic.write_text(path, "new")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_5.json"]  # stale one gone too
    monkeypatch.setattr(atomic.os, "fsync", real)
    atomic.write_text(path, "new")
    assert path.read_text() == "new"


def test_report_on_a_full_disk_is_one_line(run6: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture) -> None:
    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    assert main(["report", str(run6)]) == 0
    before = (run6 / "report.html").read_bytes()
    monkeypatch.setattr(atomic.os, "fsync", fsync)
    assert main(["report", str(run6)]) == 2
    assert "report.html" in _one_line(capsys)
    assert (run6 / "report.html").read_bytes() == before
    assert not [p for p in run6.iterdir() if ".tmp" in p.name]


# -- wrong success or a stuck state --------------------------------------------------------------


def test_resume_finds_the_run_wherever_it_is(run6: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture) -> None:
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    os.rename(run6, moved)
    assert main(["train", "--resume", str(moved), "--train.steps", "7"]) == 0
    link = tmp_path / "link"
    link.symlink_to(moved)
    assert main(["train", "--resume", str(link), "--train.steps", "8"]) == 0
    monkeypatch.chdir(moved.parent)
    assert main(["train", "--resume", "moved", "--train.steps", "9"]) == 0
    monkeypatch.chdir(moved)
    assert main(["train", "--resume", ".", "--train.steps", "10"]) == 0
    assert checkpoint.load(checkpoint.find(moved)).step == 10
    capsys.readouterr()
    for flag in ("--run.name", "--run.dir"):
        assert main(["train", "--resume", str(moved), flag, "x", "--train.steps", "12"]) == 2
        assert f"drop {flag}" in _one_line(capsys)
    assert main(["train", "--resume", str(moved), "--train.lr", "0.1", "--train.steps",
                 "12"]) == 2
    err = _one_line(capsys)
    assert "--run.name NEW --train.lr 0.1" in err and err.count("--run.name") == 1


def test_huge_step_count_and_missing_devices_are_one_line(
        tiny: dict, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *_argv({**tiny, "train.steps": 2**70})]) == 2
    assert "64-bit" in _one_line(capsys)
    if not torch.backends.mps.is_available():
        assert main(["train", *_argv({**tiny, "train.device": "mps"})]) == 2
        assert "mps" in _one_line(capsys)
    assert not (Path(tiny["run.dir"]) / "tiny").exists()


def test_compare_checks_every_arm_before_training(run6: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cmp"
    common = ["compare", "--base", str(run6), "--steps", "2", "--train.eval_batches", "2",
              "--out", str(out), "--train.threads", "1"]
    assert main([*common, "--arm", "bf16", "--arm", "snip@0.5", "--precision.candidates",
                 "bf16,bogus"]) == 2
    assert "arm snip@0.5" in _one_line(capsys)
    plan = tmp_path / "bad.json"
    bf16 = {"fprop": "bf16", "dgrad": "bf16", "wgrad": "bf16"}
    plan.write_text(json.dumps({"version": 1, "default": bf16,
                                "layers": {"layers.99.attention.wq": bf16}}))
    assert main([*common, "--arm", "bf16", "--arm", f"plan:{plan}"]) == 2
    assert "layers.99" in _one_line(capsys)
    assert main([*common[:-1], "-3", "--arm", "bf16"]) == 2
    assert "threads" in _one_line(capsys)
    assert not out.exists()  # nothing trained, no definition saved
    out.mkdir()
    (out / "sweep.json").write_text("{not json")
    assert main(["compare", "--resume", str(out)]) == 2
    assert "damaged" in _one_line(capsys)


def test_a_claim_names_its_worker(tmp_path: Path) -> None:
    from snip.compare import sweep as S

    d = tmp_path / "arm"
    d.mkdir()
    (d / S.CLAIM_FILE).write_text("1")  # an old bare PID (here: init, alive)
    assert S.claim(d)
    S.release(d)
    me = S._identity()
    (d / S.CLAIM_FILE).write_text(json.dumps({**me, "pid": 1, "start": "0"}))  # PID reused
    assert S.claim(d)
    S.release(d)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other = {**me, "pid": sleeper.pid, "start": S._start_time(sleeper.pid)}
        (d / S.CLAIM_FILE).write_text(json.dumps(other))
        assert not S.claim(d)  # a live worker's claim holds
        (d / S.CLAIM_FILE).write_text(json.dumps({**other, "boot": "another boot"}))
        assert S.claim(d)  # ... but not across a reboot
    finally:
        sleeper.kill()
        sleeper.wait()
    old = (d / S.CLAIM_FILE).stat().st_mtime - 2 * S.STALE_AFTER
    os.utime(d / S.CLAIM_FILE, (old, old))
    S.heartbeat(d)  # this worker's own claim: refreshed
    assert (d / S.CLAIM_FILE).stat().st_mtime > old + S.STALE_AFTER
    S.release(d)
    (d / S.CLAIM_FILE).write_text(json.dumps({**me, "host": "elsewhere"}))
    assert not S.claim(d)  # another machine's worker with a recent heartbeat holds it
    os.utime(d / S.CLAIM_FILE, (old, old))
    assert S.claim(d)  # ... until its heartbeat is older than STALE_AFTER


def test_a_sweep_with_rows_held_elsewhere_exits_non_zero(
        run6: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from snip.compare import sweep as S

    out = tmp_path / "cmp"
    held = out / "runs" / "b0_o0" / "fp32"
    held.mkdir(parents=True)
    # the other worker started the same comparison: its definition is there
    from snip.compare import parse_arms

    S._write_definition(S.Sweep(bases=(os.path.abspath(run6),), arms=tuple(parse_arms(
        ["bf16", "fp32"])), steps=1, orders=1, eval_batches=2, out=str(out), threads=1))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (held / S.CLAIM_FILE).write_text(json.dumps(
            {**S._identity(), "pid": sleeper.pid, "start": S._start_time(sleeper.pid)}))
        assert main(["compare", "--base", str(run6), "--arm", "bf16", "--arm", "fp32",
                     "--steps", "1", "--train.eval_batches", "2", "--out", str(out),
                     "--train.threads", "1"]) == 3
    finally:
        sleeper.kill()
        sleeper.wait()
    captured = capsys.readouterr()
    assert "not finished yet" in captured.out and "incomplete" in captured.err
    assert (out / "runs" / "b0_o0" / "bf16" / "result.json").is_file()


def test_qlinear_refuses_integer_input_like_linear() -> None:
    from snip.nn import convert

    x = torch.ones(2, 8, dtype=torch.int64)
    with pytest.raises(RuntimeError) as plain:
        torch.nn.Linear(8, 8)(x)
    model = convert(torch.nn.Sequential(torch.nn.Linear(8, 8)), "fp8_e4m3_tile128")
    with pytest.raises(RuntimeError) as quantized:
        model(x)
    assert str(quantized.value) == str(plain.value)


# -- one line, exit 2, nothing written ------------------------------------------------------------


def test_bad_run_names_and_tokenizers_are_one_line(tiny: dict, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    runs = Path(tiny["run.dir"])
    runs.mkdir()
    (runs / "dangling").symlink_to(tmp_path / "nowhere")
    for name, message in (("n" * 300, "shorter --run.name"), ("dangling", "symlink to nothing")):
        assert main(["train", *_argv({**tiny, "run.name": name})]) == 2
        assert message in _one_line(capsys)
    bad = {"bpe_only.json": b'{"type": "bpe"}',
           "bad_body.json": b'{"type": "bpe", "tokenizer": {"model": "x"}}',
           "random.json": bytes(range(256)) * 4}
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
        assert main(["train", *_argv(tiny), "--data.tokenizer", str(tmp_path / name)]) == 2
        assert "tokenizer" in _one_line(capsys)
    assert sorted(p.name for p in runs.iterdir()) == ["dangling"]  # nothing written


def test_a_hugging_face_tokenizer_json_is_read(tmp_path: Path) -> None:
    from snip.data.tokenizer import BPETokenizer, load_tokenizer, train_bpe

    tok = train_bpe(["def main(): return 42\n" * 20], vocab_size=300)
    tok._tok.save(str(tmp_path / "tokenizer.json"))  # the tokenizers library's own file
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(loaded, BPETokenizer)
    assert loaded.encode("def main()") == tok.encode("def main()")


def test_a_read_only_file_system_is_one_line(tiny: dict, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture) -> None:
    real = Path.mkdir

    def mkdir(self: Path, *a: object, **k: object) -> None:
        if "runs" in self.parts:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        real(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert main(["train", *_argv(tiny)]) == 2
    assert "read-only file system" in _one_line(capsys)


def test_eval_sample_and_report_edge_cases(run6: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    assert main(["eval", str(run6), "--json", str(tmp_path)]) == 2  # a directory
    assert "is a directory" in _one_line(capsys)
    assert main(["sample", str(run6), "--temperature", "nan"]) == 2
    assert "--temperature" in _one_line(capsys)
    (run6 / "plans" / "step_0.json").write_text("[]")  # not a plan: skipped
    assert main(["report", str(run6)]) == 0


@pytest.mark.parametrize("manifest", [{}, {"model.safetensors": "x"}])
def test_a_malformed_manifest_is_one_line(run6: Path, manifest: dict,
                                          capsys: pytest.CaptureFixture) -> None:
    meta_path = run6 / "checkpoints" / "step_000006" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "files": manifest}))
    weights = meta_path.parent / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated: only the manifest can tell
    for cmd in ("eval", "export", "sample"):
        argv = [cmd, str(run6), *(["--out", str(run6.parent / "x")] if cmd == "export" else [])]
        assert main(argv) == 2
        assert "corrupt" in _one_line(capsys)


def test_eval_reads_the_next_checkpoint_when_a_live_run_rotates_one_away(
        tiny: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import shutil

    from snip.train import inference

    train(from_sources(overrides={**tiny, "precision.preset": "bf16"}))  # checkpoints 6, 12
    run = Path(tiny["run.dir"]) / "tiny"
    real, calls = inference._load, []

    def rotating(path: Path, *a: object) -> object:
        calls.append(path.name)
        if len(calls) == 1:
            shutil.rmtree(path)  # what keep_checkpoints does under a reader
        return real(path, *a)

    monkeypatch.setattr(inference, "_load", rotating)
    assert main(["eval", str(run)]) == 0
    assert calls == ["step_000012", "step_000006"]
    assert "(step 6)" in capsys.readouterr().out


# -- resource guards ------------------------------------------------------------------------------


def test_a_run_that_cannot_fit_is_refused_before_it_is_built(
        tiny: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from snip.train import memory

    monkeypatch.setattr(memory, "available", lambda device: 24 * memory.GIB)  # a 24 GiB box
    # llama2-7b: 6.5e9 parameters x 16 bytes of fp32 state alone is ~97 GiB
    assert main(["train", *_argv({**tiny, "model.name": "llama2-7b"})]) == 2
    err = _one_line(capsys)
    assert "GiB" in err and "24.0 GiB is free" in err and "--train.force" in err
    monkeypatch.setattr(memory, "available", lambda device: 1000)  # even tiny does not fit
    assert main(["train", *_argv({**tiny, "train.steps": 1})]) == 2
    _one_line(capsys)
    assert not (Path(tiny["run.dir"]) / "tiny").exists()
    assert main(["train", *_argv({**tiny, "train.steps": 1}), "--train.force", "true"]) == 0


def test_a_corpus_larger_than_free_memory_is_streamed_and_only_in_memory_is_refused(
        tiny: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import snip.runtime
    from snip.data import load_dataset

    monkeypatch.setenv("SNIP_CACHE_DIR", str(tmp_path / "cache"))  # not tokenized before
    monkeypatch.setattr(snip.runtime, "mem_available", lambda: 100_000)  # < 8 x 150 kB
    monkeypatch.setattr("snip.data.stream.PIECE_CHARS", 4096)  # the corpus in many pieces
    assert main(["train", *_argv({**tiny, "train.steps": 2})]) == 0  # tokenized to the cache
    with pytest.raises(UserError, match="tokenize it with the cache on"):
        load_dataset(tiny["data.path"], cache=False)
