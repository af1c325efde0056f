"""One self-contained ``report.html``: final numbers, plots (PNG inlined as base64), config.

No external CSS, scripts or image files, so the page can be mailed or attached as it is.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any

from snip.report.runs import RunData

_CSS = """body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;font-size:14px}th{background:#f3f3f3}img{max-width:100%;margin:.5em 0}
pre{background:#f7f7f7;padding:1em;overflow-x:auto;font-size:12px}"""


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def summary(run: RunData) -> dict[str, Any]:
    """The final numbers shown for a run (also used by the CLI)."""
    tok = run.s("tokens_per_s").values
    train_events = [e for e in run.events if e.get("event") == "train"]
    return {
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


def _summary_table(runs: list[RunData]) -> str:
    rows = [summary(r) for r in runs]
    head = "<tr><th></th>" + "".join(f"<th>{html.escape(r.name)}</th>" for r in runs) + "</tr>"
    body = "".join("<tr><th>" + html.escape(k) + "</th>"
                   + "".join(f"<td>{_fmt(row[k])}</td>" for row in rows) + "</tr>"
                   for k in rows[0])
    return f"<table>{head}{body}</table>"


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _config_block(run: RunData) -> str:
    text = (run.path / "config.toml").read_text() if (run.path / "config.toml").is_file() else ""
    return f"<h3>{html.escape(run.name)}: config.toml</h3><pre>{html.escape(text)}</pre>"


def page(runs: list[RunData], plots: list[Path], extra_html: str = "") -> str:
    title = "snip run " + runs[0].name if len(runs) == 1 else f"snip: {len(runs)} runs compared"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             "<p>" + ", ".join(html.escape(str(r.path)) for r in runs) + "</p>", extra_html,
             "<h2>Summary</h2>", _summary_table(runs), "<h2>Plots</h2>",
             *(_img(p) for p in plots), "<h2>Configuration</h2>",
             *(_config_block(r) for r in runs), "</body></html>"]
    return "\n".join(parts)
