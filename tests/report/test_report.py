"""Reports from hand-written run directories (no training needed).

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from snip.report import load_run, summary, write_report
from snip.report.screenshot import find_browser


def _fake_run(root: Path, name: str, fp4_after: int) -> Path:
    run = root / name
    (run / "plans").mkdir(parents=True)
    (run / "config.toml").write_text('seed = 1\n[model]\nname = "tiny"\n')
    events = []
    for step in range(1, 21):
        events.append({"event": "train", "step": step, "loss": 5.0 / step ** 0.3, "lr": 1e-3,
                       "tokens_per_s": 1000.0 + step, "fp4_flop_fraction":
                       1.0 if step > fp4_after else 0.0, "time": step * 0.1, "skipped": 0})
        if step % 10 == 0:
            events.append({"event": "eval", "step": step, "val_loss": 4.0 / step ** 0.2,
                           "ppl": 2.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"torn')
    layers = ["layers.0.attention.wq", "layers.0.feed_forward.w1"]
    for step, fmt in ((0, "fp8_e4m3_tile128"), (fp4_after, "mxfp4")):
        plan = {"version": 1, "default": dict.fromkeys(("fprop", "dgrad", "wgrad"), "bf16"),
                "layers": {n: dict.fromkeys(("fprop", "dgrad", "wgrad"), fmt) for n in layers},
                "meta": {"step": step}}
        (run / "plans" / f"step_{step}.json").write_text(json.dumps(plan))
    return run


def test_single_run_report_is_self_contained(tmp_path: Path) -> None:
    run = _fake_run(tmp_path, "a", fp4_after=10)
    html = write_report([run]).read_text()
    assert html.count("data:image/png;base64,") == 5 and "<img src=\"http" not in html
    png = html.split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n"
    for f in ("loss.png", "lr.png", "precision_map.png", "fp4_fraction.png", "throughput.png"):
        assert (run / f).is_file()
    s = summary(load_run(run))
    assert s["steps"] == 20 and s["plans applied"] == 2 and s["FP4 FLOP fraction (final)"] == 1


def test_comparison_needs_out_and_overlays(tmp_path: Path) -> None:
    a, b = _fake_run(tmp_path, "a", 5), _fake_run(tmp_path, "b", 15)
    with pytest.raises(ValueError, match="--out"):
        write_report([a, b])
    out = write_report([a, b], out=tmp_path / "cmp")
    assert {"precision_map_a.png", "precision_map_b.png", "loss.png"} <= {
        p.name for p in out.parent.iterdir()}
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        load_run(tmp_path / "missing")


def test_report_never_writes_into_another_run_sweep_or_checkpoint(tmp_path: Path) -> None:
    a, b = _fake_run(tmp_path, "a", 5), _fake_run(tmp_path, "b", 15)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")
    (sweep / "runs").mkdir()
    ckpt = b / "checkpoints" / "step_000020"
    ckpt.mkdir(parents=True)
    for name in ("meta.json", "config.toml"):
        (ckpt / name).write_text("")
    before = {p: p.read_bytes() for d in (b, sweep) for p in d.rglob("*") if p.is_file()}
    for runs, out, what in (([a], b, "run"), ([a, b], b, "run"), ([a], b / "sub", "run"),
                            ([a], sweep, "snip compare sweep"), ([a], ckpt, "checkpoint")):
        with pytest.raises(ValueError, match=f"is or lies inside the {what} "):
            write_report(runs, out=out)
    after = {p: p.read_bytes() for d in (b, sweep) for p in d.rglob("*") if p.is_file()}
    assert after == before  # nothing written there
    assert not (b / "sub").exists()
    # its own directory, however spelled, and a directory of earlier overlays are fine
    assert write_report([a], out=tmp_path / "." / "a").parent == tmp_path / "a"
    write_report([a, b], out=tmp_path / "cmp")
    write_report([a, b], out=tmp_path / "cmp")


# --- reports that decide ---------------------------------------------------------------------

GEMM3 = ("fprop", "dgrad", "wgrad")
PROJ = ("attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1",
        "feed_forward.w2", "feed_forward.w3")


def _run(root: Path, name: str, *, precision: str, seed: int = 1, final: float = 2.2,
         lr: float = 1e-3, plans: list[tuple[int, dict]] | None = None,
         writeback: bool = False, model: str = "tiny", method: str = "ilp",
         plan_seed: int = 0, ffn_dim: int = 0) -> Path:
    """A run whose loss starts at 5.6 and ends at ``final``; config like the trainer's (its
    ``[model]`` section with every shape key, 0 for the name's)."""
    run = root / name
    (run / "plans").mkdir(parents=True)
    mode = "adaptive" if precision == "adaptive" else "fixed"
    preset = "" if mode == "adaptive" else precision
    wb = 'policy = "stochastic"\nformat = "e4m3"\n' if writeback else 'policy = "none"\n'
    (run / "config.toml").write_text(
        f'seed = {seed}\n[model]\nname = "{model}"\ndim = 0\nn_layers = 0\nn_heads = 0\n'
        f'n_kv_heads = 0\nffn_dim = {ffn_dim}\n[train]\nlr = {lr}\nsteps = 40\n'
        f'[precision]\nmode = "{mode}"\npreset = "{preset}"\nplan = ""\nbudget = 0.75\n'
        f'method = "{method}"\nplan_seed = {plan_seed}\n'
        f'[run]\nname = "{name}"\ndir = "{root}"\n[writeback]\n{wb}')
    events = []
    for step in range(1, 41):
        loss = final + (5.6 - final) * (1 - step / 40) ** 4 + 0.01 * (step % 3)
        e = {"event": "train", "step": step, "loss": loss, "lr": lr, "tokens_per_s": 1000.0,
             "fp4_flop_fraction": 0.5, "time": step * 0.1, "skipped": 0}
        if writeback:
            e |= {"writeback_frozen": 0.3 + step / 200, "writeback_never_moved": 0.5 - step / 100}
        events.append(e)
        if step % 10 == 0:
            events.append({"event": "eval", "step": step, "val_loss": loss + 0.1, "ppl": 9.0})
    layers = [f"layers.{i}.{p}" for i in range(2) for p in PROJ]
    fmt = "bf16" if mode == "adaptive" else precision
    plans = plans or [(0, {n: dict.fromkeys(GEMM3, fmt) for n in layers})]
    for step, table in plans:
        events.append({"event": "plan", "step": step, "changes": 0 if step == 0 else 6})
        plan = {"version": 1, "default": dict.fromkeys(GEMM3, "bf16"), "layers": table,
                "meta": {"step": step}}
        (run / "plans" / f"step_{step}.json").write_text(json.dumps(plan))
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


def _snip_plans(n_layers: int = 2, formats=("fp4_e2m1_tile128", "fp8_e4m3_tile128")):
    layers = [f"layers.{i}.{p}" for i in range(n_layers) for p in PROJ]
    first = {n: dict.fromkeys(GEMM3, "fp8_e4m3_tile128") for n in layers}
    later = {n: dict.fromkeys(GEMM3, formats[i % len(formats)]) for i, n in enumerate(layers)}
    return [(0, first), (20, later)]


def test_precision_is_named_per_run(tmp_path: Path) -> None:
    from snip.report import precision_label

    assert precision_label(load_run(_run(tmp_path, "a", precision="bf16"))) == "bf16"
    assert precision_label(load_run(_run(tmp_path, "b", precision="mxfp4"))) == "mxfp4"
    snip = load_run(_run(tmp_path, "c", precision="adaptive", plans=_snip_plans()))
    assert precision_label(snip) == "SNIP 75% fp4_e2m1_tile128 / fp8_e4m3_tile128"
    wb = load_run(_run(tmp_path, "d", precision="bf16", writeback=True))
    assert precision_label(wb) == "bf16, weights stochastic e4m3"
    html = write_report([tmp_path / "a", tmp_path / "c"], out=tmp_path / "o").read_text()
    assert "SNIP 75% fp4_e2m1_tile128 / fp8_e4m3_tile128" in html


def _rows(html: str) -> dict[str, str]:
    """run name -> its summary row."""
    table = html.split("id='summary'")[1].split("</table>")[0]
    return {r.split("<td>")[1].split("<")[0].split(" ")[0]: r
            for r in table.split("<tr")[2:]}


def test_baseline_differences_and_no_best_from_single_runs(tmp_path: Path) -> None:
    runs = [_run(tmp_path, "bf16", precision="bf16", final=2.19),
            _run(tmp_path, "fp4", precision="mxfp4", final=2.25),
            _run(tmp_path, "fp8", precision="fp8_e4m3", final=2.10)]
    html = write_report(runs, out=tmp_path / "cmp", baseline="fp4").read_text()
    rows = _rows(html)
    assert "&Delta; val vs fp4" in html
    assert "-0.0600" in rows["bf16"] and "+0.0000" in rows["fp4"] and "-0.1500" in rows["fp8"]
    assert "class='base'" in rows["fp4"]
    # single runs have no known seed spread: 0.09 nats may be noise, so nothing is crowned
    assert "class='best'" not in html and "&#9733; best" not in html
    assert "No run is marked best: the baseline <b>fp4</b> is a single run" in html
    default = write_report(runs, out=tmp_path / "cmp2").read_text()  # bf16 run by default
    assert "&Delta; val vs bf16" in default
    with pytest.raises(ValueError, match="--baseline 'nope' is not one of the runs"):
        write_report(runs, out=tmp_path / "cmp3", baseline="nope")


def test_best_only_beyond_the_seed_spread(tmp_path: Path) -> None:
    """Marked best: both recipes repeated and the means further apart than the spreads."""
    def recipe(name: str, precision: str, finals: tuple[float, float]) -> list[Path]:
        return [_run(tmp_path / name, f"{name}_s{i}", precision=precision, seed=i, final=f)
                for i, f in enumerate(finals, 1)]

    apart = recipe("bf16", "bf16", (2.20, 2.22)) + recipe("fp8", "fp8_e4m3", (2.05, 2.07))
    html = write_report(apart, out=tmp_path / "apart").read_text()
    rows = _rows(html)
    assert "class='best'" in rows["fp8_s1"] and "class='best'" in rows["fp8_s2"]
    assert "<b>fp8</b> is marked best" in html
    close = recipe("a", "bf16", (2.20, 2.30)) + recipe("b", "fp8_e4m3", (2.15, 2.25))
    html = write_report(close, out=tmp_path / "close").read_text()
    assert "class='best'" not in html  # 0.05 apart, spread 0.05 + 0.05
    assert "differ by 0.0500 nats in mean final validation loss, within their seed spread" \
        in html


def test_summary_table_fits_a_1280px_page(tmp_path: Path) -> None:
    """Few enough columns for the page, and a scrolling wrapper for the rest; no "difference
    from itself" in a single-run report."""
    runs = [_run(tmp_path, "bf16", precision="bf16"), _run(tmp_path, "fp4", precision="mxfp4")]
    html = write_report(runs, out=tmp_path / "cmp").read_text()
    table = html.split("id='summary'")[1].split("</table>")[0]
    assert "<div class=wide>" in table and table.split("</tr>")[0].count("<th>") <= 13
    single = write_report([runs[0]]).read_text()
    assert "&Delta; val vs" not in single


def test_seeds_are_grouped_with_mean_and_spread(tmp_path: Path) -> None:
    from snip.report import group_repeats

    runs = [_run(tmp_path, "bf16", precision="bf16", final=2.2),
            _run(tmp_path, "snip_s1", precision="adaptive", seed=1, final=2.30,
                 plans=_snip_plans()),
            _run(tmp_path, "snip_s2", precision="adaptive", seed=2, final=2.40,
                 plans=_snip_plans()),
            _run(tmp_path, "snip_lr", precision="adaptive", lr=3e-3, plans=_snip_plans())]
    groups = group_repeats([load_run(r) for r in runs])
    assert [(g.name, [r.name for r in g.runs]) for g in groups] == [
        ("bf16", ["bf16"]), ("snip", ["snip_s1", "snip_s2"]), ("snip_lr", ["snip_lr"])]
    html = write_report(runs, out=tmp_path / "cmp").read_text()
    repeats = html.split("id='repeats'")[1].split("</table>")[0]
    snip_row = next(r for r in repeats.split("<tr") if r.startswith("><td>snip<"))
    assert ">2<" in snip_row and "2.46" in snip_row and "&plusmn; 0.0500" in snip_row


def test_loss_zoom_excludes_the_first_losses(tmp_path: Path) -> None:
    import matplotlib.image

    run = _run(tmp_path, "a", precision="bf16", final=2.19)
    write_report([run])
    img = matplotlib.image.imread(run / "loss.png")
    assert img.shape[1] > 1.8 * img.shape[0]  # two panels side by side
    from snip.report.plots import zoom_range

    lo, hi = zoom_range([load_run(run)])
    assert 2.1 < lo and hi < 2.6  # 5.6 at the start would squash 2.19 vs 2.25


def _colours_in(png: Path) -> set[tuple[int, int, int]]:
    import matplotlib.image

    img = (matplotlib.image.imread(png)[..., :3] * 255).round().astype(int)
    return {tuple(c) for c in img.reshape(-1, 3)}


def test_precision_map_colours_each_format_and_labels_84_rows(tmp_path: Path) -> None:
    from matplotlib.colors import to_rgb

    from snip.report.precision import format_colour

    fours = ("mxfp4", "nvfp4", "fp4_e2m1_tile128")
    assert len({format_colour(f) for f in (*fours, "fp8_e4m3_tile128", "bf16")}) == 5
    run = _run(tmp_path, "small", precision="adaptive", model="small",
               plans=_snip_plans(4, (*fours, "fp8_e4m3_tile128")))
    html = write_report([run]).read_text()
    colours = _colours_in(run / "precision_map.png")
    for f in (*fours, "fp8_e4m3_tile128"):
        rgb = tuple(round(255 * c) for c in to_rgb(format_colour(f)))
        assert rgb in colours, f
    assert len(load_run(run).plans[-1][1]["layers"]) * 3 == 84
    table = html.split("class=plan>")[1].split("</table>")[0]
    assert table.count("<tr>") == 1 + 28 and "layers.3.feed_forward.w3" in table
    assert "@20: 6" not in html  # the change count is drawn in the PNG, not the HTML text
    from snip.report.plots import _short

    assert _short("layers.3.attention.wq") == "L3 attention.wq"


def test_projected_gemm_time_and_cpu_note(tmp_path: Path) -> None:
    from snip.report import projected_gemm_time

    run = _run(tmp_path, "fp4", precision="mxfp4")
    t = projected_gemm_time(load_run(run))
    assert t == {"hopper": 0.5, "blackwell": 0.25}  # FP4 at the FP8 rate on Hopper, 4x on GB200
    html = write_report([run]).read_text()
    assert "GEMM time, blackwell (projected)" in html and ">0.25<" in html
    assert "CPU emulation speed" in html and "not hardware speed" in html
    speed = html.split("id='speed'")[1].split("</table>")[0]
    assert "relative GEMM time, blackwell (projected)" in speed and ">0.25<" in speed
    assert "tokens/s measured" in speed and ">1,000<" in speed


def test_projected_gemm_time_builds_the_runs_own_shape(tmp_path: Path) -> None:
    """The ``[model]`` keys a run set (``ffn_dim`` here) size the projection's model; its
    zeros keep the name's shape, as in training."""
    from snip.models import build_model, get_config
    from snip.plan import PrecisionPlan, cost
    from snip.report import projected_gemm_time

    layers = [f"layers.{i}.{p}" for i in range(2) for p in PROJ]
    table = {n: dict.fromkeys(GEMM3, "mxfp4" if "feed_forward" in n else "bf16") for n in layers}
    plan = PrecisionPlan.from_dict({"version": 1, "default": dict.fromkeys(GEMM3, "bf16"),
                                    "layers": table})
    for ffn in (0, 64):
        run = load_run(_run(tmp_path, f"ffn{ffn}", precision="adaptive", ffn_dim=ffn,
                            plans=[(0, table)]))
        model = build_model(get_config("tiny", **({"ffn_hidden": ffn} if ffn else {})),
                            device="meta")
        want = {p: cost.relative_gemm_time(plan, model, 1, p) for p in ("hopper", "blackwell")}
        assert projected_gemm_time(run) == want
    assert want["blackwell"] > projected_gemm_time(load_run(tmp_path / "ffn0"))["blackwell"]


def test_writeback_metrics_are_plotted_when_present(tmp_path: Path) -> None:
    plain = _run(tmp_path, "plain", precision="bf16")
    write_report([plain])
    assert not (plain / "writeback.png").exists()
    wb = _run(tmp_path, "wb", precision="bf16", writeback=True)
    html = write_report([wb]).read_text()
    assert (wb / "writeback.png").is_file() and "Weight write-back" in html


def test_config_shows_only_the_differing_keys(tmp_path: Path) -> None:
    from snip.report import config_diff

    runs = [_run(tmp_path, "a", precision="bf16", lr=1e-3),
            _run(tmp_path, "b", precision="bf16", lr=3e-3)]
    diff = config_diff([load_run(r) for r in runs])
    assert set(diff) == {"train.lr", "run.name"} and diff["train.lr"] == [1e-3, 3e-3]
    html = write_report(runs, out=tmp_path / "cmp").read_text()
    keys = html.split("id='config'")[1].split("</table>")[0]
    assert "train.lr" in keys and "model.name" not in keys and "2 configuration keys" in html


def test_cli_report_baseline(tmp_path: Path, capsys) -> None:
    from snip.cli import main

    a, b = _run(tmp_path, "a", precision="bf16"), _run(tmp_path, "b", precision="mxfp4")
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "o"), "--baseline", "b"]) == 0
    assert "&Delta; val vs b" in (tmp_path / "o" / "report.html").read_text()
    out = capsys.readouterr().out
    assert "mean tokens/s 1,000" in out and "e+0" not in out  # numbers as people read them
    from snip.report.html import fmt_number

    assert fmt_number(31950.4) == "31,950" and fmt_number(2.91234) == "2.912"
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "o"), "--baseline", "c"]) == 2
    assert "--baseline 'c'" in capsys.readouterr().err


@pytest.mark.skipif(find_browser() is None, reason="no chromium on PATH")
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    """The page as a reader sees it: CSS applied, plots drawn (snip.report.screenshot)."""
    import matplotlib.image
    import numpy as np

    from snip.report.screenshot import screenshot

    runs = [_run(tmp_path, f"bf16_s{i}", precision="bf16", seed=i, final=2.3 + i / 100)
            for i in (1, 2)] + [_run(tmp_path, f"snip_s{i}", precision="adaptive", seed=i,
                                     final=2.1 + i / 100, plans=_snip_plans()) for i in (1, 2)]
    html = write_report(runs, out=tmp_path / "cmp")
    png = screenshot(html, tmp_path / "shot.png", width=1280, height=1400)  # the top
    img = (matplotlib.image.imread(png)[..., :3] * 255).round().astype(int)
    assert img.shape[:2] == (1400, 1280)
    assert len({tuple(c) for c in img.reshape(-1, 3)[::7]}) > 50  # not a blank page
    best = np.array([0xE3, 0xF4, 0xE1])  # the CSS background of the best run's row
    assert (np.abs(img - best).sum(-1) <= 3).sum() > 1000


def test_repeats_band_is_mean_min_max_of_validation_loss(tmp_path: Path) -> None:
    from snip.report.plots import repeat_band

    a = load_run(_run(tmp_path, "s_s1", precision="bf16", seed=1, final=2.3))
    b = load_run(_run(tmp_path, "s_s2", precision="bf16", seed=2, final=2.5))
    steps, mean, lo, hi = repeat_band([a, b], from_step=20)
    assert steps == [20, 30, 40]
    assert lo == a.s("val_loss").values[1:] and hi == b.s("val_loss").values[1:]
    assert mean == pytest.approx([(x + y) / 2 for x, y in zip(lo, hi, strict=True)])
    assert repeat_band([a]) is None


# -- the compare page ---------------------------------------------------------------------------

def _fake_sweep(tmp_path: Path, hp: dict[str, tuple[float, ...]], bases: int = 1,
                orders: int = 2) -> Path:
    """A finished `snip compare` directory (``bases`` x ``orders`` units, ``hp[arm][i]`` the
    final loss of the i-th unit) without training: run directories like the trainer's, a
    result.json per branch, the sweep.json."""
    from snip.compare import Sweep, parse_arms

    out = tmp_path / "cmp"
    arms = parse_arms(["bf16", "fp4=preset:mxfp4", "snip@0.75", "layer_type@0.75",
                       "random@0.75x2"])
    sweep = Sweep(bases=tuple(f"base{b}" for b in range(bases)), arms=tuple(arms), steps=40,
                  orders=orders, reference="bf16", out=str(out))
    for arm in arms:
        for i, unit in enumerate(sweep.units):
            d = sweep.run_dir(unit, arm)
            kind = "adaptive" if arm.kind.value == "adaptive" else arm.preset
            _run(d.parent, d.name, precision=kind, final=hp[arm.label][i],
                 plans=_snip_plans() if kind == "adaptive" else None,
                 method=arm.method or "ilp", plan_seed=max(arm.draw, 0))
            loss = hp[arm.label][i]
            (d / "result.json").write_text(json.dumps(
                {"unit": list(unit), "arm": arm.label, "val_loss": loss + 0.01,
                 "val_loss_hp": loss, "fp4_flop_fraction": 0.75, "step": 40}))
    (out / "sweep.json").write_text(json.dumps(sweep.to_dict()))
    return out


HP = {"bf16": (2.20, 2.30), "fp4": (2.30, 2.41), "snip@0.75": (2.21, 2.29),
      "layer_type@0.75": (2.25, 2.36), "random@0.75#0": (2.27, 2.37),
      "random@0.75#1": (2.26, 2.39)}


def test_compare_page_opens_with_the_answer(tmp_path: Path) -> None:
    from snip.compare import load_sweep, summarize
    from snip.report.sweep import write_compare_report

    out = _fake_sweep(tmp_path, HP)
    html = write_compare_report(summarize(load_sweep(out))).read_text()
    assert html.index("id='answer'") < html.index("id='arms'") < html.index("id='loss'")
    answer = html.split("id='answer'")[1].split("<h2")[0]
    assert "compare_forest" in answer and (out / "compare_forest.png").is_file()
    rows = {r.split("<b>")[1].split("<")[0]: r for r in
            answer.split("<table>")[1].split("</table>")[0].split("<tr")[2:]}
    # fp4: +0.10 and +0.11 -> interval [+0.04, +0.17] above zero: the reference wins
    assert "class='lose'" in rows["fp4"] and "higher loss than bf16" in rows["fp4"]
    # snip: +0.01 and -0.01 -> the interval contains zero
    assert "not resolved" in rows["snip@0.75"] and "class=''" in rows["snip@0.75"]
    assert "class='base'" in rows["bf16"]
    # arms named by what they are: a baseline or a random plan is not "SNIP"
    assert "baseline: the layer_type planner at 75% FP4 FLOPs" in rows["layer_type@0.75"]
    assert "baseline: random plan (seed 1) at 75% FP4 FLOPs" in rows["random@0.75#1"]
    assert "SNIP: the ILP planner at 75% FP4 FLOPs" in rows["snip@0.75"]
    precision = html.split("id='precision'")[1]
    assert "layer_type@0.75: layer_type 75% fp4_e2m1_tile128" in precision
    assert "random@0.75#1: random #1 75% fp4_e2m1_tile128" in precision
    # 2 units: no sign test can reach p < 0.05; the page says so
    assert "n = 2 units: the sign and Wilcoxon tests cannot give p below 0.5" in answer
    assert "id='hypotheses'" not in html  # no hypotheses.json: no such section


def test_compare_page_draws_the_hypotheses_in_their_order(tmp_path: Path) -> None:
    """With a hypotheses.json the page has the pre-registered section after the answer: the
    forest plot of every contrast (SNIP minus each comparator) and each verdict."""
    from snip.compare import load_sweep, summarize
    from snip.report.sweep import write_compare_report

    hp = {"bf16": (2.20, 2.22, 2.21), "fp4": (2.30, 2.33, 2.31),
          "snip@0.75": (2.21, 2.22, 2.20), "layer_type@0.75": (2.25, 2.27, 2.24),
          "random@0.75#0": (2.19, 2.24, 2.18), "random@0.75#1": (2.23, 2.22, 2.22)}
    out = _fake_sweep(tmp_path, hp, bases=3, orders=1)
    (out / "hypotheses.json").write_text(json.dumps({"delta_min": 0.002, "hypotheses": [
        {"id": "H1", "statement": "beats the rule", "contrasts": [["snip@0.75",
                                                                   "layer_type@0.75"]]},
        {"id": "H4", "statement": "beats random", "contrasts": [["snip@0.75",
                                                                 "random@0.75"]]}]}))
    html = write_compare_report(summarize(load_sweep(out))).read_text()
    assert html.index("id='answer'") < html.index("id='hypotheses'") < html.index("id='arms'")
    section = html.split("id='hypotheses'")[1].split("<h2")[0]
    assert "compare_hypotheses" in section and (out / "compare_hypotheses.png").is_file()
    rows = section.split("<tr")[2:]
    # H1: -0.04, -0.05, -0.04 over 3 bases, in both metrics: supported, and confirmatory
    assert "<b>H1</b>" in rows[0] and "<b>supported</b>" in rows[0]
    assert "layer_type@0.75" in rows[1] and "-0.0433" in rows[1] and ">3<" in rows[1]
    # H4 against the draws' mean (2.21, 2.23, 2.20): -0.00, -0.01, 0.00 -> not resolved;
    # tested second, so confirmatory too
    assert "<b>H4</b>" in rows[2] and "(exploratory)" not in rows[2]
    assert "supported" not in rows[2] + rows[3]


def test_compare_curves_use_every_unit(tmp_path: Path) -> None:
    from snip.compare import load_sweep, summarize
    from snip.report.sweep import _unit_runs, mean_curves

    summary = summarize(load_sweep(_fake_sweep(tmp_path, HP)))
    curves = mean_curves(summary, _unit_runs(summary))
    counts = {name: c[4] for name, c in curves.items()}
    assert counts == {"bf16": 2, "fp4": 2, "snip@0.75": 2, "layer_type@0.75": 2,
                      "random@0.75 (2 draws)": 4}
    steps, mean, lo, hi, _ = curves["bf16"]
    # steps count from the branch point; the two units' curves differ, so the band is open
    assert steps[0] == 1 and steps[-1] == 40 and lo[-1] < mean[-1] < hi[-1]


def test_resolution_warning() -> None:
    from snip.report.sweep import min_test_p, resolution_warning

    assert min_test_p(2) == 0.5 and min_test_p(6) == 0.03125
    assert resolution_warning(6) is None and "n = 5 units" in resolution_warning(5)
    assert "no interval and no test" in resolution_warning(1)


def test_screenshot_without_a_browser_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    from snip.report import screenshot as shot

    page = tmp_path / "p.html"
    page.write_text("<p>x</p>")
    monkeypatch.setattr(shot, "find_browser", lambda: None)
    assert shot.main([str(page), str(tmp_path / "s.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no Chromium/Chrome on PATH" in err


def test_full_page_crop_keeps_everything_above_the_background(tmp_path: Path) -> None:
    """A full-page shot renders in a tall window; the crop keeps the content (here down to
    row 299) and a margin, never cuts into it."""
    import numpy as np
    from PIL import Image

    from snip.report.screenshot import crop_to_content

    img = np.full((1000, 50, 3), 255, np.uint8)
    img[10:20, 5:9] = 0
    img[299, 40] = 17  # the last non-background pixel, far down
    png = tmp_path / "tall.png"
    Image.fromarray(img).save(png)
    crop_to_content(png, margin=16)
    out = np.asarray(Image.open(png))
    assert out.shape == (316, 50, 3) and out[299, 40, 0] == 17
