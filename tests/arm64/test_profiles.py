"""The Raspberry Pi target profiles (targets/profiles.py): CPU facts and build defaults."""
from __future__ import annotations

import json

import pytest

# (the device wheel that the emulated Pi installs has no minirt.targets: the profiles are a builder matter,
# tested in the normal suite)
pytest.importorskip("minirt.targets.profiles", reason="minirt.targets is not installed (the runtime wheel)")
from minirt.targets.profiles import TargetProfile, get_target, target_names  # noqa: E402


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


@pytest.mark.parametrize("name,core", [("rpi2", "Cortex-A7"), ("rpi3-armhf", "Cortex-A53"), ("rpi4-armhf", "Cortex-A72")])
def test_pi_profiles_32_bit(name, core):
    """32-bit Raspberry Pi OS (armhf): NEON and VFPv4 ("fma", as the runtime names it), float by default (no NEON
    int8 kernel on 32-bit ARM), panels of 8 (the same 4-lane float kernels as arm64)."""
    p = get_target(name)
    assert p.arch == "armv7" and p.os == "linux" and p.cores == 4 and p.cpu.startswith(core)
    assert p.has("neon") and p.has("fma") and not p.has("dotprod")
    assert p.kernel_isas == ("neon", "baseline")
    assert p.build_defaults() == {"quantize": None, "kernel_isas": ["neon", "baseline"], "weight_pack": 8}
    zero = get_target("rpi-zero")
    assert zero.arch == "armv6" and not zero.has("neon") and zero.kernel_isas == ("baseline",)
    assert {"rpi2", "rpi3-armhf", "rpi4-armhf", "rpi-zero"} <= set(target_names())
