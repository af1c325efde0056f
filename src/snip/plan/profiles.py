"""Throughput profiles: how fast each GEMM format runs relative to BF16 on some hardware.

The cost model (:mod:`snip.plan.cost`) turns a precision table into a *relative GEMM time*:
every GEMM's FLOPs divided by its format's speed-up over BF16, summed, over the all-BF16 sum.
A :class:`ThroughputProfile` is the speed-up table.  Its keys are, looked up in this order,

1. a preset name (``"nvfp4"``, ``"fp8_e4m3_tile128"``),
2. an element name (``"e2m1"``, ``"int4"``),
3. an element width in bits (``4``, ``6``, ``8``, ``16``, ``32``),

so a profile can say "every 4-bit format runs 4x" and still single out one preset.  ``16`` is the
unit by definition (BF16/FP16 = 1.0) and is filled in when missing.  Integer formats fall back to
the width of the float format with the same number of bits -- override them by name where that
is wrong for your hardware.

The named profiles are dense tensor-core peak ratios, with their sources:

============== ======= ======= ======= ======= ==========================================
profile         fp32    bf16    fp8/6    fp4     source
============== ======= ======= ======= ======= ==========================================
hopper          0.5     1       2 / 2    2       H100 datasheet; no FP6/FP4 math, so those
                                                 GEMMs run at the FP8 rate
blackwell       0.5     1       2 / 2    4       NVFP4 paper (arXiv 2509.25149) Table 1, GB200
blackwell_ultra 0.5     1       2 / 2    6       same table, GB300
uniform         1       1       1 / 1    1       counts FLOPs only
============== ======= ======= ======= ======= ==========================================

``fp32`` is counted at the TF32 tensor-core rate (half of BF16 on the H100 and B200 datasheets).
User tables come from a dict or a JSON file: ``{"name": ..., "relative_speed": {"4": 3.0, ...},
"source": ...}`` (JSON keys that are digits become bit widths).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from snip import jsonfile
from snip.errors import UserError
from snip.formats import QuantSpec, get_spec

SpeedKey = int | str


@dataclass(frozen=True, kw_only=True)
class ThroughputProfile:
    """Speed-up over BF16 per format (see the module docstring for the key lookup order)."""

    name: str
    relative_speed: Mapping[SpeedKey, float]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise UserError("a throughput profile needs a non-empty name")
        speeds = {16: 1.0}
        for key, value in self.relative_speed.items():
            speeds[_parse_key(key, self.name)] = _parse_speed(key, value, self.name)
        if speeds[16] != 1.0:
            raise UserError(f"profile {self.name!r}: speeds are relative to bf16, so 16-bit "
                            f"must be 1.0 (got {speeds[16]}); divide every entry by it")
        object.__setattr__(self, "relative_speed", speeds)

    def speed(self, spec: QuantSpec | str) -> float:
        """Speed-up of a GEMM whose operands use ``spec`` (preset name, element name, bits)."""
        spec = get_spec(spec)
        for key in (spec.name, spec.element.name, spec.bits):
            if key in self.relative_speed:
                return self.relative_speed[key]
        keys = ", ".join(str(k) for k in self.relative_speed)
        raise UserError(f"profile {self.name!r} has no speed for {spec.name!r} (element "
                        f"{spec.element.name}, {spec.bits} bits); add one of these keys: "
                        f"{spec.name!r}, {spec.element.name!r} or {spec.bits}.  "
                        f"Known keys: {keys}")

    def to_dict(self) -> dict:
        speeds = {str(k): v for k, v in self.relative_speed.items()}
        return {"name": self.name, "relative_speed": speeds, "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping) -> ThroughputProfile:
        unknown = set(data) - {"name", "relative_speed", "source"}
        if unknown or "relative_speed" not in data:
            raise UserError(f"a profile needs keys name, relative_speed (and optional source); "
                            f"got {sorted(data)}")
        return cls(name=data.get("name", "custom"), relative_speed=data["relative_speed"],
                   source=data.get("source", ""))

    @classmethod
    def from_json(cls, path: str | Path) -> ThroughputProfile:
        return cls.from_dict(jsonfile.read_object(path, "throughput profile file"))


def _parse_key(key: object, profile: str) -> SpeedKey:
    if isinstance(key, bool):
        raise UserError(f"profile {profile!r}: bad key {key!r}")
    if isinstance(key, int) or (isinstance(key, str) and key.isdigit()):
        return int(key)
    if isinstance(key, str) and key:
        return key.lower()
    raise UserError(f"profile {profile!r}: key {key!r} must be a bit width, an element name or "
                    f"a preset name")


def _parse_speed(key: object, value: object, profile: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise UserError(f"profile {profile!r}: speed for {key!r} must be a positive number, "
                        f"got {value!r}")
    return float(value)


_NVFP4_PAPER = "NVIDIA, 'Pretraining Large Language Models with NVFP4', arXiv 2509.25149, Table 1"
_TF32 = "fp32 counted at the TF32 tensor-core rate (0.5x BF16, H100/B200 datasheets)"

PROFILES: dict[str, ThroughputProfile] = {
    p.name: p
    for p in (
        ThroughputProfile(
            name="hopper", relative_speed={32: 0.5, 16: 1.0, 8: 2.0, 6: 2.0, 4: 2.0},
            source="NVIDIA H100 Tensor Core GPU datasheet (SXM, dense): FP8 1979 vs BF16 989 "
                   "TFLOPS.  Hopper has no FP6/FP4 tensor cores: those GEMMs run at the FP8 rate. "
                   + _TF32),
        ThroughputProfile(
            name="blackwell", relative_speed={32: 0.5, 16: 1.0, 8: 2.0, 6: 2.0, 4: 4.0},
            source=f"{_NVFP4_PAPER}: GB200, MXFP8/MXFP6 2x and MXFP4/NVFP4 4x over BF16. {_TF32}"),
        ThroughputProfile(
            name="blackwell_ultra", relative_speed={32: 0.5, 16: 1.0, 8: 2.0, 6: 2.0, 4: 6.0},
            source=f"{_NVFP4_PAPER}: GB300, MXFP8/MXFP6 2x and MXFP4/NVFP4 6x over BF16. {_TF32}"),
        ThroughputProfile(
            name="uniform", relative_speed={32: 1.0, 16: 1.0, 8: 1.0, 6: 1.0, 4: 1.0},
            source="every format at the BF16 rate: relative time equals 1 (FLOP counting only)"),
    )
}


def get_profile(profile: ThroughputProfile | str | Path | Mapping) -> ThroughputProfile:
    """A profile by name, from a dict, from a JSON file path, or passed through."""
    if isinstance(profile, ThroughputProfile):
        return profile
    if isinstance(profile, Mapping):
        return ThroughputProfile.from_dict(profile)
    if isinstance(profile, str) and profile.lower() in PROFILES:
        return PROFILES[profile.lower()]
    if isinstance(profile, Path) or (isinstance(profile, str) and profile.endswith(".json")):
        return ThroughputProfile.from_json(profile)
    raise UserError(f"unknown throughput profile {profile!r}; valid: {', '.join(PROFILES)}, "
                    f"a dict, or a path to a .json file")
