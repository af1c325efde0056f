"""snip eval and snip sample on a checkpoint: numbers that match training, clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from snip.cli import main
from snip.train import from_sources, train
from snip.train.inference import load


@pytest.fixture
def run(tiny: dict) -> tuple[Path, object]:
    result = train(from_sources(overrides={**tiny, "precision.preset": "mxfp4"}))
    return Path(tiny["run.dir"]) / "tiny", result


def test_eval_reproduces_the_runs_own_final_evaluation(run, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    path, result = run
    out = tmp_path / "eval.json"
    assert main(["eval", str(path), "--json", str(out)]) == 0
    numbers = json.loads(out.read_text())
    assert numbers["step"] == 12 and numbers["precision"] == "its plan"
    # same checkpoint, same windows, same plan: the training run's last evaluation exactly
    assert numbers["val_loss"] == result.val_loss and numbers["val_loss_hp"] == result.val_loss_hp
    assert "high precision" in capsys.readouterr().out
    # another precision changes the quantized loss only
    assert main(["eval", str(path), "--precision.preset", "bf16", "--json", str(out)]) == 0
    other = json.loads(out.read_text())
    assert other["precision"] == "bf16" and other["val_loss_hp"] == numbers["val_loss_hp"]
    assert other["val_loss"] != numbers["val_loss"]


def test_eval_holds_one_batch_at_a_time(run, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any --train.eval_batches evaluates in the memory of a few batches (a list of 3 M
    batches ran out of memory): the windows are gathered anew on each pass."""
    import weakref

    from snip.train.batches import Batches

    real, alive, most = Batches.eval_batches, [0], [0]

    def counted(self, *args):  # noqa: ANN001, ANN202
        for x, y in real(self, *args):
            alive[0] += 1
            most[0] = max(most[0], alive[0])
            weakref.finalize(x, lambda: alive.__setitem__(0, alive[0] - 1))
            yield x, y

    monkeypatch.setattr(Batches, "eval_batches", counted)
    loaded = load(run[0])
    r = loaded.evaluate(batches=40)
    assert r.loss == r.loss and most[0] <= 2  # (40 batches, two passes: mxfp4 and fp32)


def test_eval_with_bf16_gemms_keeps_the_runs_plan(run, tmp_path: Path) -> None:
    """``--precision.accum`` changes how the GEMMs multiply, not which plan is evaluated."""
    path, result = run
    out = tmp_path / "eval.json"
    assert main(["eval", str(path), "--precision.accum", "bf16", "--json", str(out)]) == 0
    numbers = json.loads(out.read_text())
    assert numbers["precision"] == "its plan" and numbers["val_loss_hp"] == result.val_loss_hp
    assert numbers["val_loss"] != result.val_loss  # bf16 GEMMs round differently


def test_eval_on_another_corpus_and_bad_input(run, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    path, _ = run
    text = tmp_path / "other.txt"
    text.write_text("completely different text, repeated. " * 400)
    assert main(["eval", str(path), "--data.path", str(text), "--train.eval_batches", "2"]) == 0
    assert "other.txt" in capsys.readouterr().out
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["eval", str(path), "--precision.preset", "fp5"]) == 2
    assert "fp5" in capsys.readouterr().err
    # --json never lands in a run (over its metrics.jsonl) or checkpoint
    metrics = (path / "metrics.jsonl").read_bytes()
    for inside in (path / "metrics.jsonl", path / "checkpoints" / "step_000012" / "e.json"):
        assert main(["eval", str(path), "--json", str(inside)]) == 2
        assert "lies inside the" in capsys.readouterr().err
    assert (path / "metrics.jsonl").read_bytes() == metrics
    assert not (path / "checkpoints" / "step_000012" / "e.json").exists()
    # a run's checkpoints directory: the run and its newest checkpoint are named
    assert main(["eval", str(path / "checkpoints")]) == 2
    err = capsys.readouterr().err
    assert f"pass its run directory {path} " in err and "step_000012" in err


def test_sample_is_reproducible_and_greedy_is_deterministic(run,
                                                            capsys: pytest.CaptureFixture) -> None:
    path, _ = run
    loaded = load(path)
    a = loaded.sample("def ", tokens=20, seed=3)
    assert a == loaded.sample("def ", tokens=20, seed=3) and len(a) > 0
    g = loaded.sample("def ", tokens=20, temperature=0)
    assert g == loaded.sample("def ", tokens=20, temperature=0, seed=9)
    assert main(["sample", str(path), "--prompt", "class ", "--tokens", "10"]) == 0
    assert capsys.readouterr().out.startswith("class ")
    assert main(["sample", str(path), "--tokens", "0"]) == 2
    assert main(["sample", str(path), "--seed", str(2**70)]) == 2  # was a ValueError traceback
    assert "--seed 1180591620717411303424 is out of range" in capsys.readouterr().err


def test_an_empty_prompt_starts_from_the_end_of_text_token(run) -> None:
    """A document's start, whatever the tokenizer's end-of-text id (a GPT-2-style BPE has it
    last; id 0 is '!' there): here the byte tokenizer told that it is byte 10."""
    loaded = load(run[0])
    tok = loaded.data.dataset.tokenizer
    tok.eot_id = 10  # (an instance attribute: this tokenizer only)
    assert loaded.sample("", tokens=12, temperature=0) == \
        loaded.sample("\n", tokens=12, temperature=0)


def test_sample_streams_the_text_it_returns(run, capsys: pytest.CaptureFixture) -> None:
    """The pieces ``on_text`` gets, joined, begin the returned text (the same text as without
    them); ``snip sample`` prints the prompt, the pieces as they come, and the rest."""
    path, _ = run
    loaded = load(path)
    pieces: list[str] = []
    text = loaded.sample("def ", tokens=30, seed=5, on_text=pieces.append)
    assert text == loaded.sample("def ", tokens=30, seed=5)
    assert len(pieces) > 1 and text.startswith("".join(pieces))
    assert all(p and not p.endswith("\ufffd") for p in pieces)
    assert main(["sample", str(path), "--prompt", "def ", "--tokens", "30", "--seed", "5"]) == 0
    assert capsys.readouterr().out == "def " + text + "\n"


def test_sample_holds_back_a_character_until_its_bytes_are_whole(run) -> None:
    """A byte-tokenizer model that emits the two bytes of 'é' one after the other: the piece
    with the first byte alone (which decodes to U+FFFD) is never given."""
    path, _ = run
    loaded = load(path)
    vocab = loaded.model.config.vocab_size
    order = iter([0xC3, 0xA9, ord("x")])

    def forced(ctx):  # logits that make the next token the next byte of the order
        logits = torch.full((1, ctx.shape[1], vocab), -1e9)
        logits[0, -1, next(order)] = 0.0
        return logits, None

    loaded.model.forward = forced
    pieces: list[str] = []
    assert loaded.sample("", tokens=3, temperature=0, on_text=pieces.append) == "éx"
    assert pieces == ["é", "x"]


def test_sample_reprints_the_text_if_decoding_changed_what_was_shown(
        run, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from snip.train.inference import Loaded

    def changed(self, prompt, on_text=None, **kw):  # a decoder that rewrote shown text
        on_text("a ")
        return "a."

    monkeypatch.setattr(Loaded, "sample", changed)
    assert main(["sample", str(run[0]), "--prompt", "P"]) == 0
    assert capsys.readouterr().out == "Pa \nPa.\n"


def test_sample_interrupted_ends_the_text_line(run, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture) -> None:
    from snip.train.inference import Loaded

    def stopped(self, prompt, on_text=None, **kw):  # Ctrl-C after a piece was printed
        on_text("abc")
        raise KeyboardInterrupt

    monkeypatch.setattr(Loaded, "sample", stopped)
    assert main(["sample", str(run[0]), "--prompt", "P"]) == 130
    captured = capsys.readouterr()
    assert captured.out == "Pabc\n" and captured.err == "snip sample: interrupted\n"
