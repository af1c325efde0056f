"""What a run prints while it trains: a bar only on a terminal, else one line per interval."""

from __future__ import annotations

from pathlib import Path

from snip.train.metrics import COMPILE_NOTE, Progress, kernels_compiled


def test_redirected_output_gets_lines_not_bar_redraws(capsys) -> None:
    p = Progress(20, 0, bar=True, terminal=False)  # log.progress true, stderr is a file
    for step in range(1, 21):
        p.update()
        if step % 10 == 0:
            p.set_postfix(loss="3.153", tok_s="31,950")
    p.close()
    out, err = capsys.readouterr()
    assert err == ""  # no tqdm redraws
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("step 10/20  loss 3.153  tok_s 31,950  eta ")
    assert lines[1] == "step 20/20  loss 3.153  tok_s 31,950"  # nothing left: no eta


def test_progress_false_still_prints_one_line_per_interval(capsys) -> None:
    p = Progress(4, 0, bar=False, terminal=True)
    p.update()
    p.set_postfix(loss="1.000")
    assert capsys.readouterr().out.startswith("step 1/4  loss 1.000")
    quiet = Progress(4, 0, bar=False, main=False)  # other ranks print nothing
    quiet.update()
    quiet.set_postfix(loss="1.000")
    assert capsys.readouterr().out == ""


def test_the_bar_starts_after_the_first_step(capsys) -> None:
    """The first step compiles kernels (20-30 s once per machine): neither the bar nor the ETA
    may take its time as the pace."""
    p = Progress(10, 0, bar=True, terminal=True)
    clock = iter([100.0, 101.0, 102.0])  # the first step ended at 100 s, then 1 s per step
    p._clock = lambda: next(clock)
    assert p._bar is None
    p.update()  # step 1 done at t=100
    assert p._bar is not None and p.eta() == ""
    p.update()  # step 2
    assert p.eta() == "0:08"  # 8 steps left at the 1 s/step pace measured from step 1 (t=101)
    p.close()


def test_compile_note_and_cache_check(monkeypatch) -> None:
    assert "compiling kernels, once per machine" in COMPILE_NOTE
    monkeypatch.setenv("SNIP_FAST", "0")
    assert kernels_compiled()  # no kernels, nothing to compile


def test_a_run_without_progress_bar_logs_lines(tiny: dict, capsys) -> None:
    from snip.train import from_sources, train

    train(from_sources(overrides={**tiny, "train.steps": 3, "log.every": 1}))
    out = capsys.readouterr().out
    assert [line.split("  ")[0] for line in out.splitlines() if line.startswith("step ")
            and "/" in line.split()[1]] == ["step 1/3", "step 2/3", "step 3/3"]
    assert Path(str(tiny["run.dir"])).is_dir()


def test_busy_names_the_pause_on_the_bar_only(capsys) -> None:
    """A statistics cycle or a validation stops the bar for seconds: the bar says which."""
    p = Progress(10, 0, bar=True, terminal=True)
    with p.busy("validating"):  # before the first step there is no bar: nothing to name
        pass
    p.update()
    with p.busy("validating"):
        assert p._bar is not None and p._bar.desc == "validating"
    assert p._bar.desc == ""
    try:
        with p.busy("re-planning"):
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert p._bar.desc == ""  # cleared however the work ends
    p.close()
    lines = Progress(10, 0, bar=False, terminal=True)  # no bar: lines only, none for a pause
    lines.update()
    with lines.busy("validating"):
        pass
    assert capsys.readouterr().out == ""
