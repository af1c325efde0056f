"""What precision a run trained in: a name for the summary, a colour per format, a cost figure.

* :func:`precision_label` names a run's recipe the way people say it: ``"bf16"``, ``"mxfp4"``,
  ``"SNIP 75% fp4_e2m1_tile128 / fp8_e4m3_tile128"`` (adaptive: the budget, then the formats of
  the final plan, narrowest first; a baseline planner is named by its method, ``"layer_type
  75% ..."``, ``"random #3 75% ..."``), ``"plan my_plan: nvfp4 / bf16"`` (a fixed plan file).
* :func:`format_colour` gives every preset its own colour within a family per element width
  (4-bit reds, 6-bit oranges, 8-bit blues, 16-bit greens, 32-bit grey): mxfp4, nvfp4 and
  fp4_e2m1_tile128 are different recipes and must not merge into one "4-bit" cell.
* :func:`projected_gemm_time` is the final plan's *relative GEMM time* from the cost model
  (:func:`snip.plan.cost.relative_gemm_time`: sum of GEMM FLOPs / format speed-up, over the
  all-BF16 sum) under named throughput profiles; 1.0 = as fast as all-BF16.  It is what the
  plan would cost on that hardware's tensor cores -- measured CPU tokens/s is emulation speed
  (fake quantization + fp32 GEMMs) and says nothing about it.
"""

from __future__ import annotations

from typing import Any

from snip.report.runs import GEMMS, RunData, plan_formats, plan_layers
from snip.train.config import PrecisionMode, WritebackPolicy

PROFILES = ("hopper", "blackwell")
_FAMILIES = {  # element bits -> colours for successive presets of that width
    4: ("#d7301f", "#f781bf", "#8c2d04", "#fb9a99", "#e7298a"),
    6: ("#fd8d3c", "#feb24c", "#d94801"),
    8: ("#2171b5", "#6baed6", "#08519c", "#9ecae1", "#4292c6", "#3f007d"),
    16: ("#41ab5d", "#a1d99b", "#006d2c"),
    32: ("#969696", "#525252"),
}
_ORDER = ("mxfp4", "nvfp4", "fp4_e2m1_tile128", "mxfp4_rht", "nvfp4_rht",
          "mxfp6_e3m2", "mxfp6_e2m3", "fp8_e4m3_tile128", "mxfp8_e4m3", "fp8_e4m3", "fp8_e5m2",
          "mxfp8_e5m2", "bf16", "fp16", "fp32")


def bits(preset: str) -> int:
    """Element width of a preset (32 for anything unknown)."""
    from snip.formats import get_spec

    try:
        return get_spec(preset).element.bits
    except (KeyError, ValueError, AttributeError):
        return 32


def _family(b: int) -> int:
    return min(_FAMILIES, key=lambda w: (abs(w - b), w))


def format_colour(preset: str) -> str:
    """A stable colour for ``preset``: its width's family, then its place in a fixed order."""
    family = _FAMILIES[_family(bits(preset))]
    rank = _ORDER.index(preset) if preset in _ORDER else len(_ORDER) + sum(map(ord, preset))
    same = [p for p in _ORDER if _family(bits(p)) == _family(bits(preset))]
    index = same.index(preset) if preset in same else rank
    return family[index % len(family)]


def sort_formats(presets: set[str] | list[str]) -> list[str]:
    """Narrowest element first, then the fixed order, then by name."""
    return sorted(set(presets), key=lambda p: (bits(p), _ORDER.index(p) if p in _ORDER
                                               else len(_ORDER), p))


def final_formats(run: RunData) -> list[str]:
    """The formats in the last plan of the run, narrowest first."""
    if not run.plans:
        return []
    plan = run.plans[-1][1]
    layers = plan_layers(run.plans[-1:])
    used = set(plan_formats(plan, layers).values()) if layers else set(
        plan.get("default", {}).values())
    return sort_formats(used - {"?"})


def precision_label(run: RunData) -> str:
    """``"bf16"``, ``"mxfp4"``, ``"SNIP 75% fp4_e2m1_tile128 / fp8_e4m3_tile128"``, ...; a
    write-back policy is appended (``"bf16, weights stochastic e4m3"``)."""
    wb = run.config.get("writeback", {})
    policy = wb.get("policy", WritebackPolicy.NONE.value)  # the written config holds values
    suffix = (f", weights {policy} {wb.get('format', '')}".rstrip()
              if policy != WritebackPolicy.NONE.value else "")
    return _gemm_label(run) + suffix


def _gemm_label(run: RunData) -> str:
    prec = run.config.get("precision", {})
    formats = final_formats(run)
    # SNIP is the ILP planner; the other methods are its baselines
    if prec.get("mode") == PrecisionMode.ADAPTIVE.value:
        budget = prec.get("budget")
        share = f" {budget:.0%}" if isinstance(budget, int | float) else ""
        method = prec.get("method", "ilp")
        name = "SNIP" if method == "ilp" else f"{method}" + (
            f" #{prec.get('plan_seed', 0)}" if method == "random" else "")
        return f"{name}{share} " + (" / ".join(formats) or prec.get("preset", "?"))
    if prec.get("plan"):
        stem = str(prec["plan"]).rsplit("/", 1)[-1].removesuffix(".json")
        return f"plan {stem}: " + " / ".join(formats)
    if prec.get("preset"):
        return str(prec["preset"])
    return " / ".join(formats) or "?"


def _model_for(run: RunData) -> Any:
    """The run's model on the meta device (shapes only): ``model.name``'s shape with the
    ``[model]`` keys the run set (0 keeps the name's, as in training); None if it cannot be
    built (an unknown name, a Hugging Face directory that moved)."""
    from snip.errors import UserError
    from snip.models import build_model, get_config
    from snip.train.config import ModelSection

    section = run.config.get("model", {})
    if not section.get("name"):
        return None
    try:  # the section as training reads it (`ModelSection.shape`)
        shape = ModelSection(**section).shape()
        return build_model(get_config(section["name"], **shape), device="meta")
    except (KeyError, ValueError, TypeError, OSError, UserError):
        return None


def projected_gemm_time(run: RunData,
                        profiles: tuple[str, ...] = PROFILES) -> dict[str, float] | None:
    """Relative GEMM time of the run's final plan per profile (``None`` without plan/model)."""
    if not run.plans:
        return None
    model = _model_for(run)
    if model is None:
        return None
    from snip.plan import PrecisionPlan, cost

    try:
        plan = PrecisionPlan.from_json(run.plans[-1][1])
        return {p: float(cost.relative_gemm_time(plan, model, 1, p)) for p in profiles}
    except (KeyError, ValueError):
        return None


def final_plan_rows(run: RunData) -> list[tuple[str, dict[str, str]]]:
    """``[(layer, {gemm: preset})]`` of the final plan, in module order."""
    if not run.plans:
        return []
    layers = plan_layers(run.plans)
    formats = plan_formats(run.plans[-1][1], layers)
    return [(layer, {g: formats[(layer, g)] for g in GEMMS}) for layer in layers]
