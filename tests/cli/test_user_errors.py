"""The CLI turns only `snip.UserError` into one line and exit 2; bugs keep their traceback.

Each bad flag here used to trace back, train a broken model, or create the run directory
before failing (issue 14)."""

from __future__ import annotations

from pathlib import Path

import pytest

import snip
from snip.cli import main
from snip.errors import MissingFileError, UserError
from snip.train.checkpoint import CheckpointError

TINY = ["--model.name", "tiny", "--train.steps", "2", "--train.batch_size", "2",
        "--train.seq_len", "16", "--train.threads", "1", "--log.progress", "false"]


def _err(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_user_error_type_is_exported() -> None:
    assert snip.UserError is UserError and issubclass(UserError, ValueError)
    assert issubclass(CheckpointError, UserError)
    assert issubclass(MissingFileError, FileNotFoundError)


@pytest.mark.parametrize("argv, match", [
    (["--train.device", "xyz"], "train.device must be auto, cpu, mps, cuda or cuda:N"),
    (["--train.lr", "1e39"], "train.lr must be a finite number"),
    (["--train.lr", "nan"], "train.lr must be a finite number"),
    (["--seed", "-1"], "seed must be in [0, 2**32)"),
    (["--train.max_skips", "-1"], "train.max_skips must be >= 0"),
    (["--dist.timeout", "0"], "dist.timeout must be > 0"),
])
def test_bad_flags_are_one_line_and_create_nothing(argv: list[str], match: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *TINY, "--run.dir", str(tmp_path / "runs"), *argv]) == 2
    assert match in _err(capsys)
    assert not any(tmp_path.iterdir())


def test_run_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    assert main(["train", *TINY, "--run.dir", str(f)]) == 2
    assert "is a file" in _err(capsys)
    assert main(["train", *TINY, "--run.dir", str(f / "sub")]) == 2
    assert "is a file" in _err(capsys)
    assert f.read_text() == "x"


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import snip.cli.formats as formats

    def broken(args: object) -> int:
        raise TypeError("a genuine bug")

    monkeypatch.setattr(formats, "run", broken)
    with pytest.raises(TypeError, match="a genuine bug"):
        main(["formats"])
    monkeypatch.setattr(formats, "run", lambda args: int("not a number"))
    with pytest.raises(ValueError, match="invalid literal"):
        main(["formats"])


def test_snip_debug_shows_user_error_traceback(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    argv = ["train", *TINY, "--run.dir", str(tmp_path), "--train.device", "xyz"]
    assert main(argv) == 2
    monkeypatch.setenv("SNIP_DEBUG", "1")
    with pytest.raises(UserError, match="train.device"):
        main(argv)
