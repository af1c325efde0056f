"""benchmarks/profile_layer_step.py records exactly the quantizer calls a layer step makes."""

import importlib.util
import sys
from pathlib import Path

import torch
from torch import nn

import snip.nn.gemm as gemm
from snip.formats import Rounding
from snip.nn import QLinear
from snip.nn.specs import Gemm

ROOT = Path(__file__).parents[2]
if str(ROOT) not in sys.path:  # the script imports benchmarks._util, as run from the root
    sys.path.insert(0, str(ROOT))
_SPEC = importlib.util.spec_from_file_location(
    "profile_layer_step_script", ROOT / "benchmarks" / "profile_layer_step.py")
script = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = script  # its dataclass looks its module up
_SPEC.loader.exec_module(script)


def _step(preset: str):
    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    layer = QLinear.from_linear(nn.Linear(32, 48, bias=False), preset)
    return script.layer_step(layer, x, torch.randn(64, 48))


def test_records_the_calls_the_function_makes_and_restores_the_quantizer() -> None:
    real = gemm.quantize_operand
    assert script.recorded_calls(_step("fp32")) == []  # identity specs quantize nothing
    # bf16: Q(X) is saved for wgrad and Q(dY) shared by both backward GEMMs -> X, W, dY once
    bf16 = script.recorded_calls(_step("bf16"))
    assert [(c.shape, c.axis) for c in bf16] == [((48, 32), -1), ((64, 32), -1), ((64, 48), -1)]
    # MXFP4 quantizes every operand per GEMM along its contraction axis (fprop W, X; dgrad
    # W, dY; wgrad X, dY), dY stochastically
    mx = script.recorded_calls(_step("mxfp4"))
    assert [(c.shape, c.axis, c.rounding) for c in mx] == [
        ((48, 32), -1, Rounding.RNE), ((64, 32), -1, Rounding.RNE),
        ((48, 32), 0, Rounding.RNE), ((64, 48), -1, Rounding.STOCHASTIC),
        ((64, 32), 0, Rounding.RNE), ((64, 48), 0, Rounding.STOCHASTIC)]
    assert gemm.quantize_operand is real


def test_a_recorded_call_replays_the_layers_own_stream() -> None:
    call = script.recorded_calls(_step("mxfp4"))[3]  # dgrad's dY at the layer's first step
    assert call.seed == gemm.operand_seed(0, 0, Gemm.DGRAD, gemm.Operand.GRAD_OUTPUT)
    assert call.describe() == {"shape": [64, 48], "spec": call.spec.name, "axis": -1,
                               "rounding": "stochastic"}
    assert script.layer_shapes("w256") == {"attn": (256, 256), "ffn_up": (256, 704),
                                           "ffn_down": (704, 256)}
