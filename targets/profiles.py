"""Device target profiles: what the builder may assume about the device.

A profile names the device's execution providers in priority order and the
CPU features the runtime may use there.  The providers issue grows these into
full capability tables; the foundation only needs the names so that
``--target`` is validated and recorded in the artifact's metadata.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TargetProfile:
    name: str
    description: str
    providers: tuple  # priority order; "cpu" is always last
    cpu_features: tuple  # e.g. ("neon", "dotprod"), ("avx2", "fma")
    os: str


_PROFILES = {
    p.name: p
    for p in (
        TargetProfile("generic", "any CPU (x86-64 or arm64), numpy kernels as baseline", ("cpu",), (), "any"),
        TargetProfile("rpi3", "Raspberry Pi 3 (Cortex-A53, arm64)", ("cpu",), ("neon",), "linux"),
        TargetProfile("rpi4", "Raspberry Pi 4 (Cortex-A72, arm64)", ("cpu",), ("neon",), "linux"),
        TargetProfile("rpi5", "Raspberry Pi 5 (Cortex-A76, arm64)", ("cpu",), ("neon", "dotprod", "fp16"), "linux"),
        TargetProfile("macos", "Mac with Apple silicon", ("coreml", "cpu"), ("neon", "dotprod", "fp16"), "macos"),
        TargetProfile("ios", "iPhone / iPad", ("coreml", "cpu"), ("neon", "dotprod", "fp16"), "ios"),
        *(
            TargetProfile(f"android-api{level}", f"Android API level {level} (arm64)", ("nnapi", "cpu"), ("neon",), "android")
            for level in range(27, 35)
        ),
    )
}


def get_target(name: str) -> TargetProfile:
    """The profile called ``name``; ValueError listing the known names otherwise."""
    try:
        return _PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; known targets: {', '.join(_PROFILES)}") from None


def target_names() -> list[str]:
    return list(_PROFILES)
