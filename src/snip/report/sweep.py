"""The page of a ``snip compare`` sweep: the answer first, then the evidence behind it.

    from snip.compare import load_sweep, summarize
    from snip.report.sweep import write_compare_report
    write_compare_report(summarize(load_sweep(Path("runs/cmp"))))   # runs/cmp/report.html

Sections, in page order:

* **Answer** -- one sentence per arm (lower / higher than the reference, or not resolved), a
  warning when the number of units ``n`` is too small for any test to resolve, the *forest
  plot* (each arm's mean paired difference to the reference with its 95% interval, both
  metrics) and the paired table: ``n``, mean difference, interval and a verdict mark.  The
  verdict is the plain reading of the interval (`snip.compare.stats.Paired.resolved`): an arm
  *wins* when its whole interval lies below zero, *loses* when it lies above, and is *not
  resolved* otherwise.
* **Pre-registered hypotheses** (only when the sweep holds a ``hypotheses.json``) -- each
  hypothesis in its declared order with its verdict (supported, falsified, inconclusive;
  confirmatory or exploratory), and the *hypothesis forest plot*: every contrast ``arm -
  comparator`` (SNIP minus each rule, control and draw family) with its 95% interval over
  bases, both metrics, beside the lines at zero and at ``-delta_min``.
* **Arms** -- what each arm is (a preset on every GEMM, SNIP's ILP at a budget, a baseline
  planner at the same budget, a random plan), its mean final losses and FP4 share.
* **Loss** -- every unit counts: per arm, the mean training loss over units (and random draws)
  with a min..max band, and the final validation loss of every unit, joined per unit across
  arms (the pairing the statistics rest on).
* **Precision** -- the precision maps of the first unit's adaptive arms.
* **Definition** -- the sweep as ``sweep.json`` holds it.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from snip.compare.arms import SNIP_METHOD, Arm, Kind
from snip.compare.stats import HypothesisResult, Paired, Verdict
from snip.compare.sweep import METRICS, Summary
from snip.report.html import Section, _img, _precision_section, _table, page
from snip.report.plots import _finish, _smooth, plt, precision_map
from snip.report.runs import RunData, load_run

TITLES = {"val_loss_hp": "validation loss, high precision (the weights)",
          "val_loss": "validation loss with each arm's plan (as it runs quantized)"}
_WIN, _LOSE, _GREY = "#2e8b3a", "#c0392b", "#7f7f7f"


def describe(arm: Arm) -> str:
    """What an arm is, in words: never "SNIP" for a baseline or a random plan."""
    share = f"{arm.budget:.0%} FP4 FLOPs"
    if arm.kind is Kind.PRESET:
        return f"{arm.preset} on every linear-layer GEMM"
    if arm.kind is Kind.PLAN:
        return f"fixed plan {Path(arm.plan).name}"
    if arm.method == SNIP_METHOD:
        return f"SNIP: the ILP planner at {share}, re-planning"
    if arm.method == "random":
        return f"baseline: random plan (seed {max(arm.draw, 0)}) at {share}"
    return f"baseline: the {arm.method} planner at {share}"


def _describe_label(label: str, arms: dict[str, Arm]) -> str:
    if label in arms:
        return describe(arms[label])
    family, _, rest = label.partition(" (mean of ")
    members = [a for a in arms.values() if a.family == family]
    if members and rest:
        return (f"baseline: mean of {rest.rstrip(')')} random plans at "
                f"{members[0].budget:.0%} FP4 FLOPs")
    return ""


def min_test_p(n: int) -> float:
    """The smallest two-sided p the sign test (and the exact Wilcoxon test) can give with ``n``
    non-zero differences: every difference of one sign, ``2 * 0.5**n``."""
    return min(1.0, 2 * 0.5 ** n) if n > 0 else 1.0


def resolution_warning(n: int, level: float = 0.05) -> str | None:
    """A sentence when ``n`` units cannot resolve a difference; None when they can."""
    if n >= 2 and min_test_p(n) < level:
        return None
    more = ("add units: more data orders (--orders) or more base checkpoints (--base); "
            "6 units are the fewest at which a sign test can reach p < 0.05")
    if n < 2:
        return f"n = {n} unit: no interval and no test is possible; {more}."
    return (f"n = {n} units: the sign and Wilcoxon tests cannot give p below "
            f"{min_test_p(n):.3g} with so few units, so they cannot resolve anything, and the "
            f"t interval (n - 1 = {n - 1} degrees of freedom) is wide; {more}.")


def verdict(p: Paired | None, reference: str) -> tuple[str, str]:
    """(row class, text) of one arm's paired difference: win / lose / unresolved."""
    if p is None:
        return "", "-"
    if p.n < 2:
        return "", "n < 2: no interval"
    if p.ci_high < 0:
        return "win", f"&#10004; lower loss than {html.escape(reference)}"
    if p.ci_low > 0:
        return "lose", f"&#10008; higher loss than {html.escape(reference)}"
    return "", "not resolved (the interval contains 0)"


def _num(v: Any, fmt: str = "{:+.4f}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


def _stats(summary: Summary, metric: str) -> dict[str, Paired]:
    return {p.arm: p for p in summary.stats.get(metric, [])}


def _answer_table(summary: Summary, metric: str, arms: dict[str, Arm]) -> str:
    stats = _stats(summary, metric)
    ref = summary.reference
    extra = sorted({k for r in summary.rows[metric] for k in r if k.startswith("beats % of ")})
    head = ["arm", "n", "mean loss", f"diff vs {html.escape(ref)}", "95% interval", "verdict",
            "sign p", "Wilcoxon p", "FP4 share", "gap closed", *map(html.escape, extra)]
    rows = []
    for r in summary.rows[metric]:
        p = stats.get(r["arm"])
        cls, text = verdict(p, ref) if r["arm"] != ref else ("base", "reference")
        ci = f"[{_num(r.get('ci_low'))}, {_num(r.get('ci_high'))}]" if "ci_low" in r else "-"
        gap = r.get("gap_closed", "-")
        gap = ("n/a (gap unresolved)" if gap is None
               else _num(gap, "{:.0%}") if gap != "-" else gap)
        cells = [f"<b>{html.escape(r['arm'])}</b><br><small>"
                 f"{html.escape(_describe_label(r['arm'], arms))}</small>", str(r["n"]),
                 _num(r["mean"], "{:.4f}"), _num(r.get("diff")), ci, text,
                 _num(r.get("sign_p"), "{:.3f}"), _num(r.get("wilcoxon_p"), "{:.3f}"),
                 _num(r.get("fp4_flop_fraction"), "{:.3f}"), gap,
                 *(_num(r.get(k), "{:.0f}") for k in extra)]
        tds = "".join(f"<td>{c}</td>" if i in (0, 5) else f"<td class=n>{c}</td>"
                      for i, c in enumerate(cells))
        rows.append(f"<tr class='{cls}'>{tds}</tr>")
    return f"<h3>{html.escape(TITLES[metric])}</h3>" + _table(head, rows)


def _sentences(summary: Summary, arms: dict[str, Arm]) -> str:
    """One line per arm on the primary metric (high-precision validation loss)."""
    ref, out = summary.reference, []
    for label, p in _stats(summary, METRICS[0]).items():
        cls, text = verdict(p, ref)
        what = html.escape(_describe_label(label, arms))
        interval = ("" if p.n < 2 else
                    f", 95% interval [{p.ci_low:+.4f}, {p.ci_high:+.4f}]")
        mark = {"win": "&#10004;", "lose": "&#10008;"}.get(cls, "&ndash;")
        out.append(f"<li>{mark} <b>{html.escape(label)}</b> <small>({what})</small>: "
                   f"{p.mean:+.4f} nats vs {html.escape(ref)}{interval}, n = {p.n}: "
                   f"{text}</li>")
    return "<ul class=answer>" + "".join(out) + "</ul>"


def forest_plot(summary: Summary, path: Path) -> Path | None:
    """Each arm's mean paired difference to the reference with its 95% interval, per metric;
    green: the interval lies below zero (the arm wins), red: above (it loses), grey: neither."""
    per_metric = [_stats(summary, m) for m in METRICS]
    labels = [r["arm"] for r in summary.rows[METRICS[0]] if r["arm"] in per_metric[0]]
    if not labels:
        return None
    fig, axes = plt.subplots(1, len(METRICS), figsize=(11, 1.2 + 0.42 * len(labels)),
                             sharey=True, squeeze=False)
    ys = list(range(len(labels)))[::-1]
    for ax, metric, stats in zip(axes[0], METRICS, per_metric, strict=True):
        for y, label in zip(ys, labels, strict=True):
            p = stats.get(label)
            if p is None:
                continue
            cls = verdict(p, summary.reference)[0]
            colour = {"win": _WIN, "lose": _LOSE}.get(cls, _GREY)
            if p.n >= 2:
                ax.errorbar(p.mean, y, xerr=[[p.mean - p.ci_low], [p.ci_high - p.mean]],
                            fmt="o", color=colour, capsize=4, lw=2, ms=6)
            else:
                ax.plot(p.mean, y, "o", color=colour, ms=6)
                ax.annotate("n=1: no interval", (p.mean, y), fontsize=7, xytext=(5, 4),
                            textcoords="offset points")
        ax.axvline(0, color="k", lw=1)
        ax.set_yticks(ys, labels, fontsize=8)
        ax.grid(alpha=0.3, axis="x")
        ax.set(xlabel=f"paired difference to {summary.reference} (nats; < 0: lower loss)",
               title={"val_loss_hp": "val loss, high precision (the weights)",
                      "val_loss": "val loss, quantized (each arm's plan)"}[metric])
    fig.suptitle("mean difference per arm with its 95% interval (green: lower than the "
                 "reference, red: higher, grey: not resolved)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_VERDICT_COLOUR = {Verdict.SUPPORTED: _WIN, Verdict.FALSIFIED: _LOSE,
                   Verdict.INCONCLUSIVE: _GREY}


def hypotheses_plot(hypotheses: list[HypothesisResult], path: Path) -> Path | None:
    """Every contrast of the pre-registered hypotheses, ``arm - comparator`` (SNIP minus each
    comparator), with its 95% interval over bases in both metrics, in the declared order.
    Colour: the contrast's verdict (green supported: the interval lies below zero in both
    metrics; red falsified: the high-precision interval lies above ``-delta_min``; grey
    inconclusive); exploratory hypotheses are drawn hollow. Dashed: ``-delta_min``."""
    rows = [(h, c) for h in hypotheses for c in h.contrasts]
    if not rows:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(13, 1.4 + 0.38 * len(rows)), sharey=True)
    ys = list(range(len(rows)))[::-1]
    names = [f"{h.spec.id}{'' if h.confirmatory else '*'}: {c.primary.arm} - "
             f"{c.primary.comparator} (n={c.primary.n})" for h, c in rows]
    for ax, which in zip(axes, ("primary", "secondary"), strict=True):
        for y, (h, c) in zip(ys, rows, strict=True):
            k = getattr(c, which)
            colour = _VERDICT_COLOUR[c.verdict]
            face = colour if h.confirmatory else "white"
            if k.n >= 2:
                ax.errorbar(k.mean, y, xerr=[[k.mean - k.ci_low], [k.ci_high - k.mean]],
                            fmt="o", color=colour, mfc=face, capsize=4, lw=2, ms=6)
            elif k.n == 1:
                ax.plot(k.mean, y, "o", color=colour, mfc=face, ms=6)
        ax.axvline(0, color="k", lw=1)
        ax.axvline(-hypotheses[0].delta_min, color="k", lw=1, ls="--")
        ax.set_yticks(ys, names, fontsize=8)
        ax.grid(alpha=0.3, axis="x")
        ax.set(xlabel="arm - comparator (nats; < 0 favours the arm)",
               title={"primary": "val loss, high precision (primary)",
                      "secondary": "val loss, as run (secondary)"}[which])
    fig.suptitle("pre-registered contrasts with 95% intervals over bases; green supported, "
                 "red falsified, grey inconclusive; * and hollow: exploratory; dashed: "
                 f"-delta_min = {-hypotheses[0].delta_min:g}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _hypotheses_section(summary: Summary, out: Path) -> Section:
    hs = summary.hypotheses
    head = ["hypothesis", "contrast", "n bases", "high precision: diff [95% CI]",
            "as run: diff [95% CI]", "verdict"]
    rows = []
    for h in hs:
        tag = h.verdict.value + ("" if h.confirmatory else " (exploratory)")
        rows.append(f"<tr><td><b>{html.escape(h.spec.id)}</b>: "
                    f"{html.escape(h.spec.statement)}</td><td>all of its contrasts</td>"
                    f"<td></td><td></td><td></td><td><b>{html.escape(tag)}</b></td></tr>")
        for c in h.contrasts:
            p, q = c.primary, c.secondary
            v = c.verdict.value + (" (below delta_min)" if c.below_delta_min else "")
            rows.append(f"<tr><td></td><td><code>{html.escape(p.arm)}</code> - <code>"
                        f"{html.escape(p.comparator)}</code></td><td class=n>{p.n}</td>"
                        f"<td class=n>{_num(p.mean)} [{_num(p.ci_low)}, {_num(p.ci_high)}]"
                        f"</td><td class=n>{_num(q.mean)} [{_num(q.ci_low)}, "
                        f"{_num(q.ci_high)}]</td><td>{html.escape(v)}</td></tr>")
    plot = hypotheses_plot(hs, out / "compare_hypotheses.png")
    intro = (f"<p>Tested in this declared order; delta_min {hs[0].delta_min:g} nats. A "
             "contrast is <i>supported</i> when its interval lies below zero in both "
             "metrics, <i>falsified</i> when its high-precision interval lies entirely above "
             "-delta_min, else <i>inconclusive</i>; after the first confirmatory hypothesis "
             "that is not supported, the rest are exploratory.</p>")
    return Section("hypotheses", "Pre-registered hypotheses",
                   intro + (_img(plot) if plot else "") + _table(head, rows))


def _unit_runs(summary: Summary) -> dict[str, list[RunData]]:
    """Every finished branch of every arm (all units), by arm label."""
    sw, out = summary.sweep, {}
    for arm in sw.arms:
        for unit in sw.units:
            d = sw.run_dir(unit, arm)
            if (d / "metrics.jsonl").is_file():
                out.setdefault(arm.label, []).append(load_run(d))
    return out


def _curve_groups(summary: Summary) -> dict[str, list[str]]:
    """Curve label -> arm labels drawn as one (the draws of a random family together)."""
    groups: dict[str, list[str]] = {}
    for arm in summary.sweep.arms:
        key = f"{arm.family} ({sum(a.family == arm.family for a in summary.sweep.arms)} draws)" \
            if arm.family else arm.label
        groups.setdefault(key, []).append(arm.label)
    return groups


def mean_curves(summary: Summary, runs: dict[str, list[RunData]]
                ) -> dict[str, tuple[list[int], list[float], list[float], list[float], int]]:
    """Curve label -> (steps since the branch point, mean, min, max, number of branches) of
    the smoothed training loss over every unit (and every draw of a random family), at the
    steps all of them logged."""
    out = {}
    for name, labels in _curve_groups(summary).items():
        curves = []
        for run in (r for a in labels for r in runs.get(a, [])):
            s = run.s("loss")
            if s.steps:  # a branch trains to base step + sweep.steps
                start = run.config.get("train", {}).get("steps", 0) - summary.sweep.steps
                curves.append(dict(zip((x - start for x in s.steps), _smooth(s.values),
                                       strict=True)))
        if curves:
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            vals = [[c[x] for c in curves] for x in steps]
            out[name] = (steps, [sum(v) / len(v) for v in vals], [min(v) for v in vals],
                         [max(v) for v in vals], len(curves))
    return out


def loss_plot(summary: Summary, runs: dict[str, list[RunData]], path: Path) -> Path | None:
    """Left: per arm, the mean smoothed training loss over every unit (and draw) with a
    min..max band (:func:`mean_curves`). Right: each unit's final validation loss (high
    precision) across the arms, one line per unit."""
    curves = mean_curves(summary, runs)
    if not curves:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    for i, (name, (steps, mean, lo, hi, count)) in enumerate(curves.items()):
        colour = f"C{i % 10}"
        left.fill_between(steps, lo, hi, color=colour, alpha=0.15, lw=0)
        left.plot(steps, mean, "o-", color=colour, lw=1.6, ms=3,
                  label=f"{name} (mean of {count})")
    left.set(xlabel="steps since the branch point", ylabel="training loss (EMA 0.3)",
             title="training loss: mean over units, band min..max")
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    arm_labels = [a.label for a in summary.sweep.arms]
    results = summary.results
    for unit in summary.sweep.units:
        ys = [results.get(a, {}).get(unit, {}).get("val_loss_hp", math.nan) for a in arm_labels]
        right.plot(range(len(arm_labels)), ys, "o-", lw=1, ms=4, alpha=0.8,
                   label=f"base {unit[0]}, order {unit[1]}")
    right.set_xticks(range(len(arm_labels)), arm_labels, rotation=30, ha="right", fontsize=7)
    right.set(ylabel="final val loss, high precision",
              title="every unit's final validation loss (one line per unit)")
    return _finish(fig, right, path)


def _arms_section(summary: Summary, arms: dict[str, Arm]) -> Section:
    rows_by = {m: {r["arm"]: r for r in summary.rows[m]} for m in METRICS}
    head = ["arm", "what it is", "units", "mean val loss (high precision)",
            "mean val loss (quantized)", "FP4 FLOP share"]
    rows = []
    for arm in summary.sweep.arms:
        hp, q = rows_by[METRICS[0]].get(arm.label, {}), rows_by[METRICS[1]].get(arm.label, {})
        cells = [html.escape(arm.label), html.escape(describe(arm)), str(hp.get("n", 0)),
                 _num(hp.get("mean"), "{:.4f}"), _num(q.get("mean"), "{:.4f}"),
                 _num(hp.get("fp4_flop_fraction"), "{:.3f}")]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" if i < 2 else f"<td class=n>{c}</td>"
                                     for i, c in enumerate(cells)) + "</tr>")
    return Section("arms", "Arms", _table(head, rows)
                   + "<p>Units without a finished branch of an arm are left out of its "
                   "numbers; the paired statistics use only the units where both the arm and "
                   "the reference finished.</p>")


def compare_sections(summary: Summary) -> list[Section]:
    """The sections of the compare page (see the module docstring); PNGs go to the sweep's
    directory."""
    sw, out = summary.sweep, Path(summary.sweep.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = {a.label: a for a in sw.arms}
    n = max((p.n for p in summary.stats.get(METRICS[0], [])), default=0)
    warning = resolution_warning(n)
    intro = (f"<p>{len(sw.arms)} arms x {len(sw.units)} units ({len(sw.bases)} base "
             f"checkpoint(s) x {sw.orders} data order(s)), {sw.steps} steps each, from "
             f"<code>{html.escape(str(out))}</code>. Paired differences to "
             f"<b>{html.escape(summary.reference)}</b> per unit (same base, same batches, "
             f"same {sw.eval_batches} strided validation batches); negative = lower loss. "
             "95% interval: Student t over units. Verdict: the interval lies below zero "
             "(&#10004;, the arm wins), above it (&#10008;, the reference wins) or "
             "contains it (not resolved).</p>")
    forest = forest_plot(summary, out / "compare_forest.png")
    body = (intro + (f"<p class=warn>&#9888; {html.escape(warning)}</p>" if warning else "")
            + _sentences(summary, arms) + (_img(forest) if forest else "")
            + "".join(_answer_table(summary, m, arms) for m in METRICS))
    made = [Section("answer", f"Paired comparison against {summary.reference}", body),
            *([_hypotheses_section(summary, out)] if summary.hypotheses else []),
            _arms_section(summary, arms)]
    runs = _unit_runs(summary)
    loss = loss_plot(summary, runs, out / "compare_loss.png")
    if loss:
        made.append(Section("loss", "Loss (every unit)", _img(loss)))
    first = [rs[0] for label, rs in runs.items() if arms[label].kind is Kind.ADAPTIVE
             and rs and rs[0].path.parent.name == "b0_o0"]
    suffix = (lambda r: "") if len(first) == 1 else (lambda r: f"_{r.name}")
    maps = [p for r in first if (p := precision_map(r, out / f"precision_map{suffix(r)}.png"))]
    if first:
        prec = _precision_section(first, maps)
        if prec is not None:
            made.append(Section("precision", "Precision (unit b0_o0, adaptive arms)",
                                prec.body))
    definition = {k: v for k, v in sw.to_dict().items() if k != "arms"}
    made.append(Section("definition", "Definition", "<pre>" + html.escape(
        "\n".join([*(f"{k} = {json.dumps(v)}" for k, v in definition.items()), "arms:",
                    *(f"  {json.dumps(a.to_dict())}" for a in sw.arms)])) + "</pre>"))
    return made


def write_compare_report(summary: Summary) -> Path | None:
    """``report.html`` of a sweep (None before any branch has finished)."""
    if not summary.results:
        return None
    sw = summary.sweep
    parts = compare_sections(summary)
    title = (f"snip compare: {len(sw.arms)} arms x {len(sw.units)} units against "
             f"{summary.reference}")
    path = Path(sw.out) / "report.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page([], parts, title=title))
    tmp.replace(path)
    return path
