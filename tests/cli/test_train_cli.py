"""`snip train` / `snip report` on the command line: help, and one-line errors (exit 2), for an
unknown option of every command too."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from snip.cli import commands, main
from snip.train.config import leaves

TINY = ["--model.name", "tiny", "--train.steps", "4", "--train.batch_size", "2",
        "--train.seq_len", "16", "--train.eval_every", "2", "--train.eval_batches", "1",
        "--train.ckpt_every", "2", "--train.threads", "1", "--log.progress", "false"]


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "text.txt"
    path.write_text((Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text())
    return path


def _err(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_help_documents_every_option_with_default(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--config", "--resume", *(f"--{leaf.key}" for leaf in leaves())):
        assert flag in out
    assert out.count("(default:") >= len(list(leaves()))


@pytest.mark.parametrize("argv, match", [
    (["--trian.steps", "5"], "unknown option --trian.steps; did you mean --train.steps?"),
    (["--train.step", "5"], "unknown option --train.step; did you mean --train.steps?"),
    (["--precision.preset", "mxfp5"], "unknown quantization preset 'mxfp5'"),
    (["--train.steps", "0"], "train.steps must be > 0"),
    (["--train.steps", "-3"], "train.steps must be > 0"),
    (["--data.path", "/nonexistent/corpus.txt"], "/nonexistent/corpus.txt"),
    (["--config", "/nonexistent/c.toml"], "config file"),
    (["--resume", "/nonexistent/run"], "/nonexistent/run"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], match: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *TINY, "--run.dir", str(tmp_path), *argv]) == 2
    assert match in _err(capsys)
    assert not any(tmp_path.iterdir())  # nothing was created


@pytest.mark.parametrize("command", sorted(commands()))
def test_every_command_answers_an_unknown_option_in_one_line(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # (nothing may be written: checked below)
    required = ["--out", "o"] if command == "export" else []  # (else argparse asks for it)
    assert main([command, *required, "--no-such-option", "3"]) == 2
    assert _err(capsys) == (f"snip {command}: error: unknown option --no-such-option; "
                            f"see snip {command} --help")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv, match", [
    (["plan", "--budgt", "0.5"], "unknown option --budgt; did you mean --precision.budget?"),
    (["plan", "--budge", "0.5"], "did you mean --precision.budget?"),  # not the old --budget
    (["formats", "--jsn"], "unknown option --jsn; did you mean --json?"),
    (["eval", "r", "--presicion.preset", "x"], "did you mean --precision.preset?"),
    (["train", "--init_from", "x"], "did you mean --init-from?"),
    (["train", "--lr", "3"], "did you mean --train.lr?"),
    (["formats", "extra", "--x"], "unexpected argument 'extra'; see snip formats --help"),
    (["sample", "r", "--tokens", "5", "20"], "unexpected argument '20'"),
])
def test_unknown_argument_names_the_closest_option(argv: list[str], match: str,
                                                   capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    assert match in _err(capsys)


def test_unknown_option_without_a_command_keeps_argparse(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--bogus"])
    assert e.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_bad_data_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    for path, match in [(empty, "empty"), (odd, "not a whole number")]:
        rc = main(["train", *TINY, "--run.dir", str(tmp_path / "runs"), "--data.path", str(path)])
        assert rc == 2
        assert match in _err(capsys)


def test_resume_checks_model_and_checkpoint(text: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    base = [*TINY, "--data.path", str(text), "--run.dir", str(tmp_path), "--run.name", "a"]
    assert main(["train", *base]) == 0
    assert "report:" in capsys.readouterr().out
    run = tmp_path / "a"
    # starting a fresh run over an existing one is refused
    assert main(["train", *base]) == 2
    assert "--resume" in _err(capsys)
    # a different model shape
    assert main(["train", "--resume", str(run), "--model.name", "small"]) == 2
    assert "different model shape" in _err(capsys)
    # a truncated newest checkpoint: named, and the previous good one suggested
    newest = run / "checkpoints" / "step_000004"
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(["train", "--resume", str(run), "--train.steps", "6"]) == 2
    err = _err(capsys)
    assert "step_000004" in err and "previous good checkpoint is" in err and "step_000002" in err


def test_report_cli(text: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for name in ("a", "b"):
        assert main(["train", *TINY, "--data.path", str(text), "--run.dir", str(tmp_path),
                     "--run.name", name, "--train.lr", "1e-3" if name == "a" else "3e-3"]) == 0
    capsys.readouterr()
    out = tmp_path / "cmp"
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    assert (out / "report.html").is_file() and (out / "loss.png").is_file()
    assert (out / "precision_map_a.png").is_file()
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "no metrics.jsonl" in _err(capsys)
    events = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert {"train", "eval", "plan", "checkpoint"} <= {e["event"] for e in events}
