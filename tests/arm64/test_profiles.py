"""The Raspberry Pi target profiles (targets/profiles.py): CPU facts and build defaults."""
from __future__ import annotations

import json

import pytest

from minirt.targets.profiles import TargetProfile, get_target, target_names


@pytest.mark.parametrize("name,core,dotprod", [("rpi3", "Cortex-A53", False), ("rpi4", "Cortex-A72", False),
                                               ("rpi5", "Cortex-A76", True)])
def test_pi_profiles(name, core, dotprod):
    p = get_target(name)
    assert p.arch == "arm64" and p.os == "linux" and p.cores == 4 and p.simd_bits == 128
    assert p.cpu.startswith(core)
    assert p.has("neon")
    assert p.has("dotprod") is dotprod and p.has("fp16") is dotprod  # both arrived with ARMv8.2 (A76)
    assert p.kernel_isas[-1] == "neon" and (p.kernel_isas[0] == "neon-dotprod") is dotprod
    d = p.build_defaults()
    assert d["quantize"] == ("int8" if dotprod else "int8-dynamic")
    assert d["weight_pack"] > 0 and d["kernel_isas"] == list(p.kernel_isas)
    meta = p.as_metadata()
    assert json.loads(json.dumps(meta)) == meta and meta["name"] == name


def test_profiles_stay_constructible_with_the_original_fields():
    p = TargetProfile("x", "test device", ("cpu",), (), "linux")
    assert p.arch == "any" and p.kernel_isas == () and p.default_quantize is None
    assert p.build_defaults() == {"quantize": None, "kernel_isas": [], "weight_pack": 0}
    assert {"generic", "rpi3", "rpi4", "rpi5"} <= set(target_names())
    assert get_target("generic").build_defaults()["quantize"] is None
