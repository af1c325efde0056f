"""One prepared GPU check for issue 12 (< 5 minutes on one H200).

    python benchmarks/gpu_check.py --out benchmarks/out/gpu_check        # needs CUDA
    python benchmarks/gpu_check.py --cpu-dry-run --out /tmp/gpu_dry     # same code, tiny, CPU

Sections (each prints a block of the report and lands in ``<out>/gpu_check.json``):

1. ``bitexact``: every preset, RNE and stochastic rounding, axis -1 and 0, on fp32 and bf16
   input: ``quantize`` on the device (PyTorch path) equals the CPU result (fused numba kernels)
   bit for bit; also ``encode`` codes and scales.
2. ``quantizer``: throughput (GB/s of input read) of snip's quantizers on the device against
   torchao's (``to_mx`` for MX formats, NVFP4Tensor, float8 tensorwise), each guarded: a missing
   or failing torchao API is recorded, not fatal.
3. ``linear``: FP8 ``QLinear`` (gemm="native", tensorwise and rowwise) forward+backward against
   a bf16 ``nn.Linear`` at 4096^3 and 8192^3 (T = in = out), plus the emulated FP8 QLinear and,
   at 8192^3, the native layer with the opt-in compiled quantizer (``SNIP_FP8_COMPILE=1``,
   whose codes are checked equal to the eager ones);
   the native-vs-emulated SQNR per GEMM (:func:`snip.nn.native_sqnr`).  Target: native FP8 at
   least 1.5x faster than bf16 at 8192^3.
4. ``train``: ``snip train`` for 50 steps of a ~100M-parameter Llama-like config (registered
   here as ``gpu-check-100m``) with adaptive precision on the device.

Without CUDA (and without ``--cpu-dry-run``) it exits with status 2 and one line.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from snip.formats import PRESETS, encode, quantize  # noqa: E402
from snip.nn import GemmImpl, QLinear, native_sqnr  # noqa: E402

FULL = dict(bitexact_shape=(256, 1024), quant_shape=(8192, 8192), linear_sizes=(4096, 8192),
            sqnr_size=1024, train_model=dict(dim=768, n_layers=12, n_heads=12, n_kv_heads=4,
                                             ffn_hidden=2816, vocab_size=256),
            train_args=["--train.steps", "50", "--train.batch_size", "16", "--train.seq_len",
                        "256", "--precision.every", "20", "--precision.warmup", "10",
                        "--train.eval_every", "50", "--train.ckpt_every", "50",
                        "--train.bf16", "true"],
            repeats=10)
DRY = dict(bitexact_shape=(8, 64), quant_shape=(64, 128), linear_sizes=(32, 64), sqnr_size=32,
           train_model=dict(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=64,
                            vocab_size=256),
           train_args=["--train.steps", "3", "--train.batch_size", "2", "--train.seq_len", "16",
                       "--precision.every", "2", "--precision.warmup", "1",
                       "--train.eval_every", "3", "--train.ckpt_every", "3",
                       "--train.eval_batches", "1", "--train.threads", "1"],
           repeats=2)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, repeats: int, warmup: int = 2) -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


# ---- 1. bit-exactness --------------------------------------------------------------------------

def check_bitexact(device: str, cfg: dict) -> dict:
    g = torch.Generator().manual_seed(0)
    r, c = cfg["bitexact_shape"]
    x = torch.randn(r, c, generator=g) * torch.logspace(-4, 4, c)
    x[0, :5] = 0.0
    x[1, 3] = float("nan")
    results, bad = {}, []
    for preset in (p for p in PRESETS if p != "fp32"):
        for rounding in ("rne", "stochastic"):
            for inp in (x, x.bfloat16()):
                for axis in (-1, 0):
                    ref = quantize(inp, preset, axis=axis, rounding=rounding, generator=5)
                    got = quantize(inp.to(device), preset, axis=axis, rounding=rounding,
                                   generator=5).cpu()
                    same = torch.equal(ref.view(torch.int16 if ref.dtype == torch.bfloat16
                                                else torch.int32),
                                       got.view(torch.int16 if got.dtype == torch.bfloat16
                                                else torch.int32))
                    key = f"{preset}/{rounding}/{str(inp.dtype)[6:]}/axis{axis}"
                    results[key] = same
                    if not same:
                        bad.append(key)
        qa, qb = encode(x, preset), encode(x.to(device), preset)
        same = torch.equal(qa.codes, qb.codes.cpu()) and (
            qa.scales is None or torch.equal(qa.scales.view(torch.uint8),
                                             qb.scales.cpu().view(torch.uint8)))
        results[f"{preset}/encode"] = same
        if not same:
            bad.append(f"{preset}/encode")
    return {"cases": len(results), "mismatches": bad, "all_equal": not bad}


# ---- 2. quantizer throughput -------------------------------------------------------------------

def _torchao_quantizers(device: str) -> dict:
    """name -> callable(x) for the torchao quantizers this install has (errors recorded)."""
    out: dict = {}
    try:
        from torchao.prototype.mx_formats.mx_tensor import to_mx

        out["mxfp8_e4m3"] = lambda x: to_mx(x, torch.float8_e4m3fn, 32)
        out["mxfp4"] = lambda x: to_mx(x, torch.float4_e2m1fn_x2, 32)
    except Exception as e:  # noqa: BLE001 - any import failure is a recorded result
        out["_mx_error"] = f"{type(e).__name__}: {e}"
    try:
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor

        out["nvfp4"] = lambda x: NVFP4Tensor.to_nvfp4(x)
    except Exception as e:  # noqa: BLE001
        out["_nvfp4_error"] = f"{type(e).__name__}: {e}"
    try:
        from torchao.float8.float8_utils import tensor_to_scale

        def f8(x):
            s = tensor_to_scale(x, torch.float8_e4m3fn)
            return (x * s).clamp(-448, 448).to(torch.float8_e4m3fn)

        out["fp8_e4m3"] = f8
    except Exception as e:  # noqa: BLE001
        out["_fp8_error"] = f"{type(e).__name__}: {e}"
    return out


def check_quantizer(device: str, cfg: dict) -> dict:
    r, c = cfg["quant_shape"]
    x = torch.randn(r, c, device=device, dtype=torch.bfloat16)
    gb = x.numel() * x.element_size() / 1e9
    ao = _torchao_quantizers(device)
    rows = {}
    for preset in ("fp8_e4m3", "fp8_e4m3_row", "mxfp8_e4m3", "mxfp4", "nvfp4",
                   "fp4_e2m1_tile128"):
        row = {}
        for rounding in ("rne", "stochastic"):
            t = timed(lambda p=preset, rd=rounding: quantize(x, p, rounding=rd, generator=1),
                      device, cfg["repeats"])
            row[f"snip_{rounding}_GBps"] = float(f"{gb / t:.3g}")
        if preset in ao:
            try:
                t = timed(lambda f=ao[preset]: f(x), device, cfg["repeats"])
                row["torchao_GBps"] = float(f"{gb / t:.3g}")
            except Exception as e:  # noqa: BLE001
                row["torchao_error"] = f"{type(e).__name__}: {e}"[:200]
        rows[preset] = row
    errors = {k: v for k, v in ao.items() if k.startswith("_")}
    return {"shape": [r, c], "input_dtype": "bf16", "presets": rows, "torchao_errors": errors,
            "note": "snip: fake quantization (quantize+dequantize, bf16 out); torchao: "
                    "quantize to codes+scales"}


# ---- 3. FP8 linear layers ----------------------------------------------------------------------

def _linear_step(layer: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor):
    def step():
        layer.weight.grad = None
        xi = x.detach().requires_grad_(True)
        y = layer(xi)
        y.backward(dy)
    return step


def check_linear(device: str, cfg: dict) -> dict:
    out = {"sizes": {}}
    for n in cfg["linear_sizes"]:
        torch.manual_seed(0)
        x = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        dy = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        res = {}
        ref = torch.nn.Linear(n, n, bias=False, device=device, dtype=torch.bfloat16)
        res["bf16_linear_ms"] = 1e3 * timed(_linear_step(ref, x, dy), device, cfg["repeats"])
        for preset in ("fp8_e4m3", "fp8_e4m3_row"):
            for impl in (GemmImpl.NATIVE, GemmImpl.EMULATED):
                if impl is GemmImpl.EMULATED and n > 4096:
                    continue  # emulation at 8192^3 only costs time; 4096 shows the gap
                q = QLinear(n, n, bias=False, specs=preset, device=device, dtype=torch.bfloat16)
                q.set_gemm(impl, strict=impl is GemmImpl.NATIVE)
                ms = 1e3 * timed(_linear_step(q, x, dy), device, cfg["repeats"])
                res[f"{preset}_{impl.value}_ms"] = ms
                res[f"{preset}_{impl.value}_speedup_vs_bf16"] = res["bf16_linear_ms"] / ms
        out["sizes"][str(n)] = res
        del x, dy
    big = str(max(cfg["linear_sizes"]))
    out["compiled"] = check_compiled(device, cfg, int(big))
    bf16_ms = out["sizes"][big]["bf16_linear_ms"]
    for k, v in list(out["compiled"].items()):
        if k.endswith("_ms"):
            out["sizes"][big][k.replace("_ms", "_speedup_vs_bf16")] = bf16_ms / v
    best = max(v for k, v in out["sizes"][big].items() if k.endswith("speedup_vs_bf16")
               and "native" in k)
    out["target"] = {"size": int(big), "best_native_speedup": best, "goal": 1.5,
                     "met": best >= 1.5}
    s = cfg["sqnr_size"]
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(s, s, generator=g).to(device)
    ws = (torch.randn(s, s, generator=g) * s**-0.5).to(device)
    out["sqnr_native_vs_emulated_db"] = {p: native_sqnr(xs, ws, p)
                                         for p in ("fp8_e4m3", "fp8_e4m3_row")}
    return out


def check_compiled(device: str, cfg: dict, n: int) -> dict:
    """The opt-in fused quantizer (``SNIP_FP8_COMPILE=1``, CUDA only): same codes as eager, and
    the native FP8 layer's time with it."""
    import os

    from snip.formats import Rounding, get_spec
    from snip.nn.native import fp8_operand

    if not device.startswith("cuda"):
        return {"skipped": "torch.compile'd quantizer runs on CUDA only"}
    x = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    dy = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    res: dict = {}
    old = os.environ.get("SNIP_FP8_COMPILE")
    try:
        for preset in ("fp8_e4m3", "fp8_e4m3_row"):
            spec = get_spec(preset)
            for axis in (-1, 0):
                os.environ["SNIP_FP8_COMPILE"] = "0"
                eager = fp8_operand(x, spec, axis, Rounding.RNE, None)
                os.environ["SNIP_FP8_COMPILE"] = "1"
                fused = fp8_operand(x, spec, axis, Rounding.RNE, None)
                res[f"{preset}_axis{axis}_codes_equal"] = bool(
                    torch.equal(eager.codes.view(torch.uint8), fused.codes.view(torch.uint8))
                    and torch.equal(eager.scale, fused.scale))
            q = QLinear(n, n, bias=False, specs=preset, device=device, dtype=torch.bfloat16)
            q.set_gemm("native", strict=True)
            res[f"{preset}_native_compiled_ms"] = 1e3 * timed(_linear_step(q, x, dy), device,
                                                              cfg["repeats"], warmup=3)
    finally:
        if old is None:
            os.environ.pop("SNIP_FP8_COMPILE", None)
        else:
            os.environ["SNIP_FP8_COMPILE"] = old
    return res


# ---- 4. a short adaptive training run ----------------------------------------------------------

def check_train(device: str, cfg: dict, out_dir: Path) -> dict:
    from snip.cli import main as snip_main
    from snip.models import configs as model_configs

    name = "gpu-check-100m"
    model_cfg = model_configs.get_config("small", **cfg["train_model"])
    model_configs._CONFIGS[name] = model_cfg  # registered for this process only
    from snip.models import build_model

    with torch.device("meta"):
        n_params = sum(p.numel() for p in build_model(model_cfg).parameters())
    args = ["train", "--model.name", name, "--precision.mode", "adaptive",
            "--train.device", device, "--run.dir", str(out_dir / "runs"), "--run.name",
            "gpu_check", *cfg["train_args"]]
    t0 = time.perf_counter()
    try:
        rc = snip_main(args)
    finally:
        model_configs._CONFIGS.pop(name, None)
    wall = time.perf_counter() - t0
    run = out_dir / "runs" / "gpu_check"
    metrics = []
    path = run / "metrics.jsonl"
    if path.is_file():
        metrics = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    losses = [m["loss"] for m in metrics if "loss" in m]
    plans = sorted(p.name for p in (run / "plans").glob("*.json")) if (run / "plans").is_dir() \
        else []
    return {"command": "snip " + " ".join(args), "exit_code": rc, "params": n_params,
            "wall_s": round(wall, 1), "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None, "plans": plans}


# ---- driver ------------------------------------------------------------------------------------

def environment(device: str) -> dict:
    env = {"torch": torch.__version__, "python": platform.python_version(),
           "platform": platform.platform(), "device": device,
           "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
        env["capability"] = list(torch.cuda.get_device_capability(0))
        env["cuda"] = torch.version.cuda
    try:
        import torchao

        env["torchao"] = torchao.__version__
    except Exception:  # noqa: BLE001
        env["torchao"] = None
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "gpu_check"))
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="run every section at tiny sizes on the CPU (checks the script works)")
    ap.add_argument("--only", default="bitexact,quantizer,linear,train",
                    help="comma-separated sections")
    args = ap.parse_args(argv)
    if args.cpu_dry_run:
        device, cfg = "cpu", DRY
    elif torch.cuda.is_available():
        device, cfg = "cuda", FULL
    else:
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False); run it on a GPU "
              "machine or use --cpu-dry-run", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"environment": environment(device), "dry_run": args.cpu_dry_run}
    sections = {"bitexact": lambda: check_bitexact(device, cfg),
                "quantizer": lambda: check_quantizer(device, cfg),
                "linear": lambda: check_linear(device, cfg),
                "train": lambda: check_train(device, cfg, out_dir)}
    t_all = time.perf_counter()
    for name in args.only.split(","):
        t0 = time.perf_counter()
        try:
            report[name] = sections[name]()
        except Exception as e:  # noqa: BLE001 - one failing section must not hide the others
            report[name] = {"error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc()[-2000:]}
        report[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"== {name} ({report[name]['seconds']} s)")
        print(json.dumps({k: v for k, v in report[name].items() if k != "traceback"},
                         indent=1, default=str)[:4000])
        (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    report["total_seconds"] = round(time.perf_counter() - t_all, 1)
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    ok = all("error" not in report[n] for n in args.only.split(","))
    ok = ok and report.get("bitexact", {}).get("all_equal", True)
    print(f"gpu_check: {'OK' if ok else 'PROBLEMS'} in {report['total_seconds']} s; "
          f"JSON: {out_dir / 'gpu_check.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
