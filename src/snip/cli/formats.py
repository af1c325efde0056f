"""``snip formats``: a table of every element format and preset."""

from __future__ import annotations

import argparse

COMMAND = "formats"
HELP = "print every element format and quantization preset with its storage cost and range"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead")


def _g(v: float) -> str:
    return f"{v:.6g}"


def transform(spec) -> str:  # noqa: ANN001
    """What is applied before quantizing: ``"RHT 32"`` or ``"-"``."""
    return f"RHT {spec.hadamard}" if spec.hadamard else "-"


def format_tables() -> str:
    from snip.formats import ELEMENTS, PRESETS

    lines = [
        "Element formats",
        f"{'name':<8} {'bits':>4} {'E':>2} {'M':>2} {'bias':>4} "
        f"{'special':<7} {'max':>12} {'min normal':>12} {'min subnormal':>13}",
    ]
    for f in ELEMENTS.values():
        lines.append(
            f"{f.name:<8} {f.bits:>4} {f.ebits:>2} {f.mbits:>2} {f.bias:>4} "
            f"{f.special.value if f.is_float else 'int':<7} {_g(f.max_normal):>12} "
            f"{_g(f.min_normal):>12} {_g(f.min_subnormal):>13}"
        )
    lines += [
        "",
        "Presets",
        f"{'name':<18} {'element':<7} {'bits/elem':>9} {'max':>9} "
        f"{'min subnormal':>13}  {'scaling (block, scale format)':<32} {'grad rounding':<13} "
        f"{'transform':<13}",
    ]
    for s in PRESETS.values():
        e = s.element
        lines.append(
            f"{s.name:<18} {e.name:<7} {s.bits_per_element:>9.4g} {_g(e.max_normal):>9} "
            f"{_g(e.min_subnormal):>13}  {s.describe_scaling():<32} {s.grad_rounding.value:<13} "
            f"{transform(s):<13}".rstrip()
        )
    lines.append("")
    lines.append(
        "bits/elem includes block scales; per-tensor and per-row scales add 32 bits per "
        "tensor or row (NVFP4 also keeps one fp32 tensor scale). transform: RHT N is a "
        "seeded randomized Hadamard transform of size N along the contraction axis before "
        "quantizing (it spreads outliers over a block; *_rht presets differ from their plain "
        "twins only in it)."
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.json:
        import json

        from snip.formats import ELEMENTS, PRESETS

        data = {
            "elements": {
                n: {
                    "bits": f.bits,
                    "ebits": f.ebits,
                    "mbits": f.mbits,
                    "bias": f.bias,
                    "special": f.special.value,
                    "max": f.max_normal,
                    "min_normal": f.min_normal,
                    "min_subnormal": f.min_subnormal,
                }
                for n, f in ELEMENTS.items()
            },
            "presets": {
                n: {
                    "element": s.element.name,
                    "bits_per_element": s.bits_per_element,
                    "scaling": s.describe_scaling(),
                    "grad_rounding": s.grad_rounding.value,
                    "hadamard": s.hadamard,
                }
                for n, s in PRESETS.items()
            },
        }
        print(json.dumps(data, indent=2))
    else:
        print(format_tables())
    return 0
