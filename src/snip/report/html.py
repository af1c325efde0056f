"""One self-contained ``report.html``: a page of sections, PNGs inlined as base64.

No external CSS, scripts or image files, so the page can be mailed or attached as it is.

The page is a list of :class:`Section` (an anchor, a title, an HTML body).  :func:`sections`
builds the standard ones -- summary (one row per run: its precision, final numbers, the
difference from the baseline, projected GEMM time; a recipe is marked best only when it beats
the others by more than their seed spread, see :func:`pick_best`), repeats (mean and
spread of runs that differ only in their seed), loss, precision (maps + the final plan per
layer), speed, write-back, configuration (only the keys that differ) -- and ``write_report``
accepts more (``extra_sections``), e.g. a ``snip compare`` table, inserted before the
configuration.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snip.report.compare import Group, config_diff, mean_spread
from snip.report.precision import (
    PROFILES,
    final_plan_rows,
    format_colour,
    precision_label,
    projected_gemm_time,
)
from snip.report.runs import GEMMS, RunData, plan_formats, plan_layers

_CSS = """body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;color:#222;
padding:0 1em}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;
padding:3px 7px;text-align:left;font-size:13px}th{background:#f3f3f3}td.n{text-align:right;
font-variant-numeric:tabular-nums}tr.best td{background:#e3f4e1;font-weight:600}
tr.base td{background:#eef3fb}img{max-width:100%;margin:.5em 0}.note{color:#8a1c1c;
font-size:13px}pre{background:#f7f7f7;padding:1em;overflow-x:auto;font-size:12px}
.plan td{font-size:10px;padding:1px 4px}.plan th{font-size:11px}.plan td.f{color:#fff}
nav a{margin-right:1em}.wide{overflow-x:auto;max-width:100%}th{font-weight:600}
tr.win td{background:#e3f4e1}tr.lose td{background:#fbe4e1}.warn{background:#fff4d6;
border-left:4px solid #e0a800;padding:.5em 1em}.answer{font-size:15px}small{color:#666}
.flex{display:flex;gap:1.5em;align-items:flex-start;flex-wrap:wrap}"""

CPU_NOTE = ("Measured tokens/s is CPU emulation speed (fake quantization, then fp32 GEMMs), "
            "not hardware speed: low precision is slower here, not faster. The projected "
            "relative GEMM time is the final plan's GEMM FLOPs divided by each format's "
            "tensor-core speed-up over bf16 (cost model, throughput profiles "
            + ", ".join(PROFILES) + "); 1.0 = as fast as all-bf16, lower is faster; "
            "quantization kernels, attention and communication are not in it.")


@dataclass(frozen=True)
class Section:
    """One part of the page: ``<h2 id=anchor>title</h2>`` then ``body`` (HTML)."""

    anchor: str
    title: str
    body: str


def fmt_number(v: Any) -> str:
    """How numbers are shown: 4 significant digits, thousands separated (``31,950``, not
    ``3.195e+04``); None and NaN as ``-``."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


_fmt = fmt_number


def summary(run: RunData) -> dict[str, Any]:
    """The final numbers shown for a run (also used by the CLI)."""
    tok = run.s("tokens_per_s").values
    train_events = [e for e in run.events if e.get("event") == "train"]
    return {
        "precision": precision_label(run),
        "steps": run.s("loss").steps[-1] if run.s("loss").steps else 0,
        "final train loss": run.s("loss").last,
        "final val loss": run.s("val_loss").last,
        "final val ppl": run.s("ppl").last,
        "best val loss": min(run.s("val_loss").values) if run.s("val_loss").values else None,
        "mean tokens/s": sum(tok) / len(tok) if tok else None,
        "FP4 FLOP fraction (final)": run.s("fp4_flop_fraction").last,
        "plans applied": len(run.plans),
        "skipped steps": train_events[-1].get("skipped", 0) if train_events else 0,
        "train time (s)": train_events[-1].get("time") if train_events else None,
    }


def _delta(v: float | None, base: float | None, pct: bool = False) -> str:
    if v is None or base is None:
        return "-"
    if pct:
        return f"{100 * (v / base - 1):+.1f}%" if base else "-"
    return f"{v - base:+.4f}"


def pick_best(groups: list[Group], baseline: RunData) -> tuple[Group | None, str]:
    """The recipe to mark best, and the sentence that says why (or why none is).

    A recipe is best only when the difference is larger than what seeds alone move: the
    baseline and the best recipe must each have repeats (a single run has no known seed
    spread), and the best mean must be lower than every other recipe's mean by more than the
    two half-ranges together (the runner-up's, or the largest seen, if it is a single run)."""
    if len(groups) < 2:
        return None, ""
    stats = {id(g): mean_spread([summary(r)["final val loss"] for r in g.runs]) for g in groups}
    scored = sorted((g for g in groups if stats[id(g)][0] is not None),
                    key=lambda g: stats[id(g)][0])
    if len(scored) < 2:
        return None, ""
    base = next(g for g in groups if baseline in g.runs)
    best, runner = scored[0], scored[1]
    margin = stats[id(runner)][0] - stats[id(best)][0]
    single = next((g for g in (base, best) if not g.repeated), None)
    if single is not None:
        role = "baseline" if single is base else "lowest"
        return None, (f"No run is marked best: the {role} <b>{html.escape(single.name)}</b> is "
                      "a single run, so its seed-to-seed spread is unknown and a difference "
                      f"of {margin:.4f} nats between the two lowest cannot be told from noise;"
                      " repeat it with other seeds (--seed N, --run.name NAME_sN).")
    halves = [stats[id(g)][1] for g in groups if g.repeated]
    noise = stats[id(best)][1] + (stats[id(runner)][1] if runner.repeated else max(halves))
    if margin <= noise:
        return None, (f"No run is marked best: <b>{html.escape(best.name)}</b> and "
                      f"<b>{html.escape(runner.name)}</b> differ by {margin:.4f} nats in mean "
                      f"final validation loss, within their seed spread ({noise:.4f}).")
    return best, (f"<b>{html.escape(best.name)}</b> is marked best: its mean final validation "
                  f"loss is {margin:.4f} nats below the next recipe "
                  f"({html.escape(runner.name)}), more than their seed spread ({noise:.4f}).")


def _table(head: list[str], rows: list[str]) -> str:
    """A table that scrolls inside the page rather than running off its edge."""
    return ("<div class=wide><table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
            + "".join(rows) + "</table></div>")


def _summary_section(runs: list[RunData], baseline: RunData,
                     groups: list[Group] | None = None) -> Section:
    rows = {r.name: summary(r) for r in runs}
    times = {r.name: projected_gemm_time(r) for r in runs}
    base = rows[baseline.name]
    several = len(runs) > 1
    best_group, verdict = pick_best(groups or [Group(r.name, [r]) for r in runs], baseline)
    best = {r.name for r in best_group.runs} if best_group else set()
    head = ["run", "precision", "steps", "final train loss", "final val loss",
            *([f"&Delta; val vs {html.escape(baseline.name)}"] if several else []),
            *(f"GEMM time, {p} (projected)" for p in PROFILES), "FP4 FLOP share",
            "tokens/s (CPU)", "plans", "skipped", "time (s)"]
    body = []
    for r in runs:
        s, t = rows[r.name], times[r.name] or {}
        cls = "best" if r.name in best else "base" if r is baseline and several else ""
        mark = " &#9733; best" if r.name in best else " (baseline)" if cls == "base" else ""
        cells = [f"{html.escape(r.name)}{mark}", html.escape(s["precision"])]
        cells += [_fmt(v) for v in (s["steps"], s["final train loss"], s["final val loss"])]
        if several:
            cells.append(_delta(s["final val loss"], base["final val loss"]))
        cells += [*(_fmt(t.get(p)) for p in PROFILES), _fmt(s["FP4 FLOP fraction (final)"]),
                  _fmt(s["mean tokens/s"]), _fmt(s["plans applied"]), _fmt(s["skipped steps"]),
                  _fmt(s["train time (s)"])]
        tds = "".join(f"<td>{c}</td>" if i < 2 else f"<td class=n>{c}</td>"
                      for i, c in enumerate(cells))
        body.append(f"<tr class='{cls}'>{tds}</tr>")
    note = (f"<p>Differences are from the baseline <b>{html.escape(baseline.name)}</b>. "
            f"{verdict}</p>" if several else "")
    return Section("summary", "Summary", _table(head, body) + note
                   + f"<p class=note>{CPU_NOTE}</p>")


def _repeats_section(groups: list[Group], baseline: RunData) -> Section | None:
    if not any(g.repeated for g in groups):
        return None
    base_group = next(g for g in groups if baseline in g.runs)
    base_mean = mean_spread([summary(r)["final val loss"] for r in base_group.runs])[0]
    rows = []
    for g in groups:
        stats = [summary(r) for r in g.runs]
        mean, half, std = mean_spread([s["final val loss"] for s in stats])
        tok = mean_spread([s["mean tokens/s"] for s in stats])[0]
        spread = "-" if half is None or not g.repeated else f"&plusmn; {half:.4f}" + (
            f" (sd {std:.4f})" if std is not None else "")
        rows.append(f"<tr><td>{html.escape(g.name)}</td><td class=n>{len(g.runs)}</td>"
                    f"<td>{html.escape(stats[0]['precision'])}</td><td class=n>{_fmt(mean)}"
                    f"</td><td class=n>{spread}</td><td class=n>{_delta(mean, base_mean)}</td>"
                    f"<td class=n>{_fmt(tok)}</td><td>"
                    + ", ".join(html.escape(r.name) for r in g.runs) + "</td></tr>")
    head = ("<tr><th>recipe</th><th>runs</th><th>precision</th><th>final val loss (mean)</th>"
            "<th>spread (half range)</th><th>&Delta; vs baseline's group</th>"
            "<th>tokens/s (CPU, mean)</th><th>runs</th></tr>")
    text = ("<p>Runs whose configurations differ only in the seed (or whose names differ only "
            "in a seed suffix) are repeats of one recipe: mean and spread of the final "
            "validation loss.</p>")
    return Section("repeats", "Repeats (seeds)", text + f"<table>{head}{''.join(rows)}</table>")


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _plan_table(run: RunData) -> str:
    """The final plan, one row per layer, cells coloured like the map (equal GEMMs merged)."""
    rows = final_plan_rows(run)
    if not rows:
        return ""
    head = "<tr><th>layer (final plan)</th>" + "".join(f"<th>{g}</th>" for g in GEMMS) + "</tr>"

    def cells(specs: dict[str, str]) -> str:
        fmts = list(specs.values())
        if len(set(fmts)) == 1:
            return (f"<td class=f colspan={len(fmts)} style='background:"
                    f"{format_colour(fmts[0])}'>{html.escape(fmts[0])}</td>")
        return "".join(f"<td class=f style='background:{format_colour(f)}'>{html.escape(f)}"
                       "</td>" for f in fmts)

    body = "".join(f"<tr><td>{html.escape(layer)}</td>{cells(specs)}</tr>"
                   for layer, specs in rows)
    return f"<table class=plan>{head}{body}</table>"


def _plots(plots: list[Path], *prefixes: str) -> list[Path]:
    return [p for p in plots if p.stem.startswith(prefixes)]


def _precision_section(runs: list[RunData], plots: list[Path]) -> Section | None:
    maps = {p.stem.removeprefix("precision_map").lstrip("_"): p
            for p in _plots(plots, "precision_map")}
    parts = []
    for run in runs:
        title = f"<h3>{html.escape(run.name)}: {html.escape(precision_label(run))}</h3>"
        m = maps.get(run.name if len(runs) > 1 else "")
        fmts = {f for _, plan in run.plans for f in plan_formats(plan, plan_layers([(0, plan)]))
                .values()}
        if len(fmts) == 1:  # one format everywhere, all run long: a sentence says it better
            parts.append(f"{title}<p>Every linear-layer GEMM in {html.escape(fmts.pop())} for "
                         "the whole run (embeddings, LM head and norms stay in high "
                         "precision).</p>")
            continue
        if m is None:
            continue
        parts.append(f"{title}<div class=flex><div style='flex:5;min-width:560px'>{_img(m)}"
                     f"</div><div style='flex:3'>{_plan_table(run)}</div></div>")
    parts += [_img(p) for p in _plots(plots, "fp4_fraction")]
    return Section("precision", "Precision", "".join(parts)) if parts else None


def _speed_table(runs: list[RunData]) -> str:
    """Projected GEMM time (what the plan would cost on tensor cores) next to measured speed."""
    head = ("<tr><th>run</th><th>precision</th>"
            + "".join(f"<th>relative GEMM time, {p} (projected)</th>" for p in PROFILES)
            + "<th>tokens/s measured (CPU emulation)</th></tr>")
    rows = []
    for r in runs:
        t, s = projected_gemm_time(r) or {}, summary(r)
        rows.append(f"<tr><td>{html.escape(r.name)}</td><td>{html.escape(s['precision'])}</td>"
                    + "".join(f"<td class=n>{_fmt(t.get(p))}</td>" for p in PROFILES)
                    + f"<td class=n>{_fmt(s['mean tokens/s'])}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _config_section(runs: list[RunData]) -> Section:
    full = "".join(f"<details><summary>{html.escape(r.name)}: config.toml</summary><pre>"
                   f"{html.escape(_config_text(r))}</pre></details>" for r in runs)
    if len(runs) == 1:
        return Section("config", "Configuration", full)
    diff = config_diff(runs)
    head = "<tr><th>key</th>" + "".join(f"<th>{html.escape(r.name)}</th>" for r in runs)
    body = "".join(f"<tr><td>{html.escape(k)}</td>"
                   + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in vals) + "</tr>"
                   for k, vals in diff.items())
    text = (f"<p>{len(diff)} configuration keys differ between the runs; all others are "
            "equal.</p>" if diff else "<p>The runs have identical configurations.</p>")
    return Section("config", "Configuration", text + f"<table>{head}</tr>{body}</table>" + full)


def _config_text(run: RunData) -> str:
    f = run.path / "config.toml"
    return f.read_text() if f.is_file() else ""


def sections(runs: list[RunData], plots: list[Path], *, baseline: RunData,
             groups: list[Group]) -> list[Section]:
    """The standard sections of a report, in page order (configuration last)."""
    made = [
        _summary_section(runs, baseline, groups),
        _repeats_section(groups, baseline),
        Section("loss", "Loss", "".join(_img(p) for p in _plots(plots, "loss", "lr"))),
        _precision_section(runs, plots),
        Section("speed", "Speed", _speed_table(runs) + f"<p class=note>{CPU_NOTE}</p>"
                + "".join(_img(p) for p in _plots(plots, "throughput"))),
    ]
    wb = _plots(plots, "writeback")
    if wb:
        made.append(Section("writeback", "Weight write-back", "".join(map(_img, wb))))
    made.append(_config_section(runs))
    return [s for s in made if s is not None]


def page(runs: list[RunData], parts: list[Section], title: str | None = None) -> str:
    """The whole HTML document."""
    title = title or ("snip run " + runs[0].name if len(runs) == 1
                      else f"snip: {len(runs)} runs compared")
    nav = "<nav>" + "".join(f"<a href='#{s.anchor}'>{html.escape(s.title)}</a>"
                            for s in parts) + "</nav>"
    body = "".join(f"<h2 id='{s.anchor}'>{html.escape(s.title)}</h2>\n{s.body}\n" for s in parts)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            "<p>" + ", ".join(html.escape(str(r.path)) for r in runs) + f"</p>{nav}\n{body}"
            "</body></html>")
