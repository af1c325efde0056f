"""Exploratory (not pre-registered): what a variant of the layer's Python would save, in a
training step, measured in one process against the real code.

    PYTHONPATH=src python benchmarks/results/issue21/xeon/session3/explore/toggle.py \
        MODEL PRESET VARIANT [ROUNDS]

Three arms of ``bench_train_step``'s quick setup step in interleaved rounds (1 thread, CPU
time): plain fp32 PyTorch, the preset's model on the real code (``off``) and the same model
with VARIANT switched on for its steps only (``on``).  Reported: the paired difference
``(on - off) / fp32`` over the rounds, mean and about a 95 % interval (2.1 standard errors),
and each arm's median ratio to fp32.  Appends one JSON line to ``toggle.jsonl`` beside it.

Variants (the ``lean*`` ones train with other SR seeds than snip's: timing only):

- ``lean``: each ``QLinear`` of the preset calls a minimal autograd Function that makes the
  same six ``quantize_fused`` calls (mxfp4-like presets: 1-D blocks, RNE forward, SR
  gradients) and the same three GEMMs, and nothing else;
- ``leanqop`` / ``leanseed`` / ``leansaved``: ``lean`` plus one piece of the real path: the
  ``quantize_operand`` wrapper, ``operand_seed``'s hash, or the ``_Saved`` bookkeeping (make,
  keep, stash, unstash); ``leanall``: all three;
- ``qlin``: ``QLinear.forward`` straight to the real Function (no step tensor, record,
  autocast look-up or input checks).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[6]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_train_step as B  # noqa: E402
import snip.nn.gemm as G  # noqa: E402
from snip.formats import Rounding, fast  # noqa: E402
from snip.nn import QLinear  # noqa: E402

B.SHAPES.update(B.QUICK_SHAPES)
ON = [False]


def lean_function(qop: bool, seed: bool, saved: bool) -> type[torch.autograd.Function]:
    def q(x, spec, axis, rounding, s):
        if qop:
            return G.quantize_operand(x, spec, axis, rounding, s)
        return fast.quantize_fused(x, spec, axis, rounding, s)

    def sd(base, gemm, k):
        return G.operand_seed(base, 3, gemm, G.Operand.GRAD_OUTPUT) if seed else base * 7 + k

    class Lean(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, cfg):
            x2 = x.reshape(-1, x.shape[-1])
            f = cfg.specs.fprop
            sv = G._Saved(cfg, False, False, G.SavedBytes()) if saved else None
            wq = q(w, f.for_weight(), -1, Rounding.RNE, 0)
            xq = q(x2, f, -1, Rounding.RNE, 0)
            if saved:
                sv.keep("weight", w, weight=True, counted=False)
                sv.keep("input", x2, weight=False)
                sv.stash(ctx)
            else:
                ctx.save_for_backward(x2, w)
            ctx.cfg, ctx.shape = cfg, x.shape
            return (xq @ wq.t()).reshape(*x.shape[:-1], -1)

        @staticmethod
        def backward(ctx, dy):
            if saved:
                sv = G._Saved.unstash(ctx)
                x2, w = sv.x, sv.w
            else:
                x2, w = ctx.saved_tensors
            s, base = ctx.cfg.specs, ctx.cfg.seed
            dy2 = dy.reshape(-1, dy.shape[-1])
            a = q(dy2, s.dgrad, -1, Rounding.STOCHASTIC, sd(base, G.Gemm.DGRAD, 0))
            b = q(w, s.dgrad.for_weight(), 0, Rounding.RNE, 0)
            dx = (a @ b).reshape(ctx.shape)
            c = q(dy2, s.wgrad, 0, Rounding.STOCHASTIC, sd(base, G.Gemm.WGRAD, 1))
            d = q(x2, s.wgrad, 0, Rounding.RNE, 0)
            if saved:
                sv.release()
            return dx, c.t() @ d, None
    return Lean


def install(variant: str) -> None:
    real = QLinear.forward
    if variant == "qlin":
        def forward(self, x):
            if not ON[0]:
                return real(self, x)
            s = self.__dict__.get("_toggle_step", 0)
            self.__dict__["_toggle_step"] = s + 1
            cfg = self._config(torch.float32).at_step(s)
            return G.QuantizedLinearFn.apply(x, self.weight, self.bias, cfg, None, True)
    else:
        fn = lean_function(qop=variant in ("leanqop", "leanall"),
                           seed=variant in ("leanseed", "leanall"),
                           saved=variant in ("leansaved", "leanall"))

        def forward(self, x):
            if not ON[0]:
                return real(self, x)
            s = self.__dict__.get("_toggle_step", 0)
            self.__dict__["_toggle_step"] = s + 1
            return fn.apply(x, self.weight, self._config(torch.float32).at_step(s))
    QLinear.forward = forward


def main() -> None:
    model, preset, variant = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 21
    if variant not in ("lean", "leanqop", "leanseed", "leansaved", "leanall", "qlin"):
        raise SystemExit(f"unknown variant {variant}")
    torch.set_num_threads(1)
    install(variant)
    batch = B.batch_for(model)
    arms = {"fp32": B.Arm(model, "fp32", batch), "off": B.Arm(model, preset, batch),
            "on": B.Arm(model, preset, batch)}

    def step(k: str) -> float:
        ON[0] = k == "on"
        return arms[k].step()[1] * 1e3

    for _ in range(3):
        for k in arms:
            step(k)
    t: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(rounds):
        for k in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            t[k].append(step(k))
    d = [(a - b) / f for a, b, f in zip(t["on"], t["off"], t["fp32"], strict=True)]
    mean, half = statistics.mean(d), 2.1 * statistics.stdev(d) / len(d) ** 0.5
    med = {k: statistics.median(v) / statistics.median(t["fp32"]) for k, v in t.items()}
    print(f"{model} {preset} {variant}: off {med['off']:.3f} on {med['on']:.3f}  "
          f"paired (on - off) / fp32 {mean:+.4f} +- {half:.4f}  (n = {rounds})")
    line = {"model": model, "preset": preset, "variant": variant, "rounds": rounds,
            "diff_mean": mean, "diff_half_width": half, "ratio_off": med["off"],
            "ratio_on": med["on"], "cpu_ms": t}
    with open(Path(__file__).with_name("toggle.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
