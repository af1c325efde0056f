"""The comparison table as Markdown (printed, ``compare.md``) and HTML (in ``report.html``)."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from snip import atomic
from snip.compare.sweep import METRICS, Summary

_TITLES = {"val_loss_hp": "validation loss, high precision (the weights)",
           "val_loss": "validation loss with each arm's plan (as it runs quantized)"}


def _num(v: Any, fmt: str = "{:+.4f}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


def _columns(rows: list[dict[str, Any]], reference: str) -> list[tuple[str, list[str]]]:
    extra = sorted({k for r in rows for k in r if k.startswith("beats % of ")})
    head = ["arm", "n", "mean", f"diff vs {reference}", "95% CI", "sign p", "Wilcoxon p",
            "FP4 share", "gap closed", *extra]
    body = []
    for r in rows:
        ci = (f"[{_num(r.get('ci_low'))}, {_num(r.get('ci_high'))}]" if "ci_low" in r else "-")
        gap = r.get("gap_closed", "-")
        gap = "n/a (gap unresolved)" if gap is None else _num(gap, "{:.0%}") if gap != "-" else gap
        body.append([r["arm"] + (" (reference)" if r["arm"] == reference else ""), str(r["n"]),
                     _num(r["mean"], "{:.4f}"), _num(r.get("diff")), ci,
                     _num(r.get("sign_p"), "{:.3f}"), _num(r.get("wilcoxon_p"), "{:.3f}"),
                     _num(r.get("fp4_flop_fraction"), "{:.3f}"), gap,
                     *(_num(r.get(k), "{:.0f}") for k in extra)])
    return [(h, [row[i] for row in body]) for i, h in enumerate(head)]


def markdown(summary: Summary) -> str:
    """One table per metric, with the sweep's shape and how to read it."""
    sw = summary.sweep
    lines = [f"# snip compare: {len(sw.arms)} arms x {len(sw.units)} units "
             f"({len(sw.bases)} bases x {sw.orders} orders), {sw.steps} steps each", "",
             f"Paired differences to `{summary.reference}` per unit (same base, same batches, "
             f"same {sw.eval_batches} strided validation batches); negative = lower loss than "
             "the reference. 95% CI: Student t over units."
             + (f" Gap closed: share of the `{summary.gap_reference}` to `{sw.gap}` loss gap "
                "that the arm closes." if sw.gap else ""), ""]
    if summary.hypotheses:
        lines += [hypotheses_markdown(summary), ""]
    if summary.diagnostics:
        lines += [diagnostics_markdown(summary.diagnostics), ""]
    for metric in METRICS:
        cols = _columns(summary.rows[metric], summary.reference)
        lines += [f"## {_TITLES[metric]}", "", "| " + " | ".join(h for h, _ in cols) + " |",
                  "|" + "---|" * len(cols)]
        for i in range(len(cols[0][1])):
            lines.append("| " + " | ".join(c[i] for _, c in cols) + " |")
        lines.append("")
    return "\n".join(lines)


def hypotheses_markdown(summary: Summary) -> str:
    """The pre-registered hypotheses, in their order, with each contrast's interval (base
    means) in both metrics and its verdict."""
    hs = summary.hypotheses
    lines = [f"## Pre-registered hypotheses (delta_min {hs[0].delta_min:g} nats; fixed "
             "sequence: after the first one not supported the rest are exploratory)", "",
             "| hypothesis | contrast | n bases | high precision: diff [95% CI] | "
             "as run: diff [95% CI] | verdict |", "|---|---|---|---|---|---|"]
    for h in hs:
        tag = f"**{h.verdict.value}**" + ("" if h.confirmatory else " (exploratory)")
        lines.append(f"| {h.spec.id}: {h.spec.statement} | all of its contrasts | | | | "
                     f"{tag} |")
        for c in h.contrasts:
            p, q = c.primary, c.secondary
            v = c.verdict.value + (" (below delta_min)" if c.below_delta_min else "")
            lines.append(f"| | `{p.arm}` - `{p.comparator}` | {p.n} | {_num(p.mean)} "
                         f"[{_num(p.ci_low)}, {_num(p.ci_high)}] | {_num(q.mean)} "
                         f"[{_num(q.ci_low)}, {_num(q.ci_high)}] | {v} |")
    return "\n".join(lines)


def diagnostics_markdown(diag: dict[str, Any]) -> str:
    """Top-unit shares and the regressions on "the comparator keeps the top unit high"."""
    tops = diag["top_units"]
    shares = [t["share"] for t in tops if t["share"] is not None]
    layers: dict[str, int] = {}
    for t in tops:
        layers[t["layer"]] = layers.get(t["layer"], 0) + 1
    lines = [f"## Diagnostics (damage maps of `{diag['damage_arm']}`, {len(tops)} units)", "",
             f"Top unit per unit: {', '.join(f'{k} ({v})' for k, v in sorted(layers.items()))}; "
             f"its share of the summed single-layer damage: median "
             f"{_num(float(sorted(shares)[len(shares) // 2]) if shares else None, '{:.0%}')}.",
             "", "| contrast | n | comparator keeps top high | slope on that [95% CI] | "
             "diff where kept [95% CI] |", "|---|---|---|---|---|"]
    for r in diag["regressions"]:
        lines.append(f"| `{r['arm']}` - `{r['comparator']}` | {r['n']} | {r['n_kept']} | "
                     f"{_num(r['beta'])} [{_num(r['beta_low'])}, {_num(r['beta_high'])}] | "
                     f"{_num(r['mean_kept'])} [{_num(r['mean_kept_low'])}, "
                     f"{_num(r['mean_kept_high'])}] |")
    return "\n".join(lines)


def html_tables(summary: Summary) -> str:
    parts = ["<p>Per-unit differences (same base checkpoint, same batches, same strided "
             "validation windows); negative means a lower loss than the reference. "
             "95% CI: Student t over units.</p>"]
    for metric in METRICS:
        cols = _columns(summary.rows[metric], summary.reference)
        head = "".join(f"<th>{html.escape(h)}</th>" for h, _ in cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c[i])}</td>" for _, c in cols)
                       + "</tr>" for i in range(len(cols[0][1])))
        parts.append(f"<h3>{html.escape(_TITLES[metric])}</h3><table><tr>{head}</tr>{body}"
                     "</table>")
    return "\n".join(parts)


def _finite(v: Any) -> Any:
    """The structure with NaN/inf as null: compare.json stays standard JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v


def write_summary(summary: Summary) -> tuple[Path, Path]:
    """``compare.json`` and ``compare.md`` in the sweep's directory (atomically)."""
    out = Path(summary.sweep.out)
    paths = (out / "compare.json", out / "compare.md")
    texts = (json.dumps(_finite(summary.to_dict()), indent=1) + "\n", markdown(summary))
    for path, text in zip(paths, texts, strict=True):
        atomic.write_text(path, text)
    return paths
