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
    # provider name -> facts the builder's provider spec reads (versions, precision...)
    provider_info: dict = dataclasses.field(default_factory=dict, compare=False)
    # --- the CPU, for choosing kernels, packing and quantization defaults ---
    arch: str = "any"  # "arm64", "x86_64", "armv7" / "armv6" (32-bit ARM, armhf) or "any"
    cpu: str = ""  # core model and SoC, e.g. "Cortex-A72 (BCM2711)"
    cores: int = 0  # 0: unknown
    simd_bits: int = 0  # vector register width the kernels can count on (NEON: 128)
    llc_kb: int = 0  # last-level cache (KiB) shared by the cores: bounds the GEMM blocking
    # Native kernel implementations in order of preference; the runtime still
    # checks the CPU at run time (getauxval on arm64) and falls back along this list.
    kernel_isas: tuple = ()
    # Quantization the builder picks for ``--quantize auto`` on this target
    # (None: keep float32); "int8" needs calibration data, and without it the
    # builder falls back to "int8-dynamic".
    default_quantize: str | None = None
    # output-channel panel width of the GEMM/Conv weights the builder stores pre-packed (builder/prepack.py;
    # 0: not packed); the NEON kernels use panels of 8
    weight_pack: int = 0
    # --- int8 speed rules: which layers the quantizer keeps float because float is faster on this CPU ---
    # (builder/quantize/__init__.py reads them; layers kept float for speed still store their weights int8
    # when they have at least weight_only_min_elements, behind a DequantizeWeights.)
    # Depthwise convolutions compute in int8.  Off everywhere: since the float depthwise kernel's channel
    # blocks (D44), int8 depthwise no longer pays as a whole (PP-OCR det int8/float 0.654-0.661x with it,
    # 0.631-0.639x without, D29); without VNNI (arm64, AVX2) its portable path is slower still.
    int8_depthwise: bool = False
    # ... except, in static int8, depthwise convs whose input plane has at least this many pixels (0: none):
    # on 160 x 160 planes the x86 VNNI int8 kernel, chained in uint8 with the pointwise QConvs around it,
    # beats float (PP-OCR det int8/float 0.613-0.619x -> 0.588-0.591x; no gain on 80 x 80, D30).  0 on
    # arm64 targets: there the int8 depthwise kernel has only its portable path.
    int8_depthwise_min_plane: int = 160 * 160
    # ... and at least this many when the depthwise conv is strided (0: the same threshold): the int8
    # kernel splits each input row into column parities first, a cost per input pixel (D181, D182).
    int8_depthwise_strided_min_plane: int = 0
    # Chained int8 between every pair of QConvs (uint8 from the producer's epilogue straight into the
    # consumer), not only into and out of depthwise convs: where the uint8 store is cheaper than a float
    # store plus the consumer's quantize pass, the AVX-512 VNNI store's folded requantization (D181:
    # ResNet-18 int8 / float 0.405 -> 0.390, RegNetY-400MF 0.636 -> 0.602, same outputs).  Elsewhere
    # chaining GEMM convs measured slower (D20).
    int8_chain_everywhere: bool = False
    # Pointwise (1x1) convs with fewer input channels than this stay float: quantizing the input costs
    # about what int8 saves (12 channels no faster in int8; 16 pay since the implicit int8 conv, D30).
    int8_min_reduction: int = 16
    # Pointwise (1x1, ungrouped) convs with fewer output channels than this stay float (0: none): the input
    # is quantized once per layer whatever its output count, and few outputs do not amortise it.
    int8_min_pointwise_outputs: int = 0
    # Ungrouped convs with a window (k x k > 1) whose reduction (input channels x kh x kw) is below this
    # stay float (0: none): a 3-channel stem (reduction 27) is 1.57x float in int8 on AVX2 without VNNI.
    int8_min_window_reduction: int = 0
    # Grouped convs (not depthwise) with fewer output channels per group than this stay float (0: none):
    # each group is a GEMM of a few rows (RegNet's groups of 8-16 channels 2.1-2.9x float on AVX2).
    int8_min_group_outputs: int = 0
    # Pointwise convs (1x1, ungrouped) writing planes of at least int8_large_plane pixels per channel stay
    # float below int8_min_large_plane_reduction input channels (0: no such rule): their float input and
    # output no longer fit in L2 beside each other, and int8's extra pass over the input (its
    # quantization) costs more than the shorter products save (RegNetY-400MF's 32 -> 48 conv at 112 x 112:
    # 740 against 542 us in float on a Zen 4 with VNNI, D171).
    int8_large_plane: int = 0
    int8_min_large_plane_reduction: int = 0
    # int8 weights of the layers the int8 GEMM computes keep every pair it multiplies side by side
    # within |w0| + |w1| <= 128 (builder/quantize/weights.py, quantize_pair_limited), where that GEMM adds
    # the two u8 x s8 products in an int16 (AVX2 without VNNI: vpmaddubsw, exact then, twice the products
    # per instruction of the widening route, D172).
    int8_pair_limited_weights: bool = False
    # A conv kept float for speed stores its weight int8 (weights-only) from this many elements: below, the
    # few bytes saved cost accuracy where it shows.  Tried 64 (D173): PP-OCR cls int8 file 0.32 -> 0.30x the
    # float one, but its small convs (8-48 channels, 8-27 products per output) rounded to int8 cost the
    # PP-OCR pipeline 5.6 points of exact lines (92.96 -> 87.32 %, float 90.14).
    weight_only_min_elements: int = 1024
    # --- the int8 cost model (builder/quantize/cost.py, D87): whether a quantization is faster on this
    # device, estimated from these figures (the builder host is not the device; timing there decides
    # nothing).  Units: the time of one float32 multiply-add in a GEMM.
    # int8 multiply-adds done in the time of one float32 one, in the GEMM-shaped layers.  Fitted on a
    # Zen 5 with VNNI (9 real CNNs, int8 / float measured 0.43-1.02: fitted within about 11%): 2.5;
    # AVX2 without VNNI with pair-limited weights (D172, Zen 3): 1.6, estimates against measured int8 /
    # float ResNet-18 0.66 / 0.74, SqueezeNet 0.79 / 0.76, EfficientNet-B0 0.91 / 0.81, MobileNetV2
    # 0.96 / 0.76, PP-OCR cls 1.20 / 0.94 (pessimistic where most layers stay float).  The default, for
    # a CPU without an int8 dot product whose widening multiplies do twice the lanes of an FMA, is
    # assumed, not measured.
    int8_macs_per_float_mac: float = 1.5
    # quantizing one activation element at an int8 layer's input (twice that in int8-dynamic); it
    # also stands for the int8 layer's other fixed costs (fitted with the above: 30)
    int8_convert_cost: float = 30.0
    # one FLOP of any other op (memory-bound elementwise work, the same in float and int8; fitted: 4)
    element_cost: float = 4.0
    # --quantize auto takes a quantized mode only when its estimate is at most this x float latency
    int8_worth_ratio: float = 0.9
    # float 3x3 convs the device's kernels run as Winograd F(2x2, 3x3) (packed_weights.conv_uses_winograd: the
    # layers mrt_conv2d_uses_winograd takes, AVX2 only) do their multiply-adds this many times faster than the
    # direct conv's (1.0: no such path).  Measured on AVX2 (D178, single layers): 1.25-2.2x, 1.6x on ResNet-18's
    # 64 -> 64 @56x56 (4.74 -> 2.95 ms); 1.5 is taken (WINOGRAD_FLOAT_SPEEDUP).
    float_winograd_speedup: float = 1.0
    # int8 3x3 convs the device's int8 kernels run as Winograd F(2x2, 3x3) in exact integers
    # (packed_weights.qconv_uses_winograd: AVX2 without VNNI, D180) do their multiply-adds this many times
    # faster than the direct int8 kernels (1.0: no such path).  Measured (single layers, Zen 3): 1.16-1.5x;
    # ResNet-18 int8 / float 0.76 -> 0.66 whole; 1.4 is taken (INT8_WINOGRAD_SPEEDUP).
    int8_winograd_speedup: float = 1.0

    def has(self, feature: str) -> bool:
        """Whether every device of this target has ``feature`` (e.g. "dotprod")."""
        return feature in self.cpu_features

    def build_defaults(self) -> dict:
        """What the builder derives from the target when the user does not say."""
        return {"quantize": self.default_quantize, "kernel_isas": list(self.kernel_isas),
                "weight_pack": self.weight_pack}

    def int8_speed_rules(self) -> dict:
        """The int8 speed thresholds of this device (what the quantizer reads; see the fields)."""
        return {"int8_depthwise": self.int8_depthwise, "int8_depthwise_min_plane": self.int8_depthwise_min_plane,
                "int8_depthwise_strided_min_plane": self.int8_depthwise_strided_min_plane,
                "int8_chain_everywhere": self.int8_chain_everywhere,
                "int8_min_reduction": self.int8_min_reduction,
                "int8_min_window_reduction": self.int8_min_window_reduction,
                "int8_min_pointwise_outputs": self.int8_min_pointwise_outputs,
                "int8_min_group_outputs": self.int8_min_group_outputs,
                "int8_large_plane": self.int8_large_plane,
                "int8_min_large_plane_reduction": self.int8_min_large_plane_reduction,
                "int8_pair_limited_weights": self.int8_pair_limited_weights,
                "weight_only_min_elements": self.weight_only_min_elements}

    def as_metadata(self) -> dict:
        """The profile as JSON-able data, recorded in artifacts as ``target.profile``."""
        out = dataclasses.asdict(self)
        out["providers"], out["cpu_features"], out["kernel_isas"] = (
            list(self.providers), list(self.cpu_features), list(self.kernel_isas))
        return out


# The int8 speed rules of x86-64 without VNNI: pair-limited weights (D172) let the GEMM multiply with
# vpmaddubsw, exact.  Measured on a Zen 3 host, int8 / float of single Conv + Relu layers at 1 thread
# (interleaved thread time): pointwise 8 -> 48 at 112 x 112 1.01x, 16 -> 16 1.06x, 16 -> 48 0.97x, 12 -> 72
# at 56 x 56 1.00x, 24 -> 72 0.87x, 24 -> 144 0.76x, 40 -> 120 at 28 x 28 0.77x, 48 -> 192 0.71x, 320 ->
# 1280 at 7 x 7 0.61x (int8_min_reduction 24); 3 x 3 windows over 3 channels (stems, stride 2) 1.19-1.30x,
# over 4 0.98x, 6 1.01x, 8 0.69x, 16 0.77x, 64 0.70x, 7 x 7 over 3 (ResNet's stem) 0.83x
# (int8_min_window_reduction 64); grouped 3 x 3 convs of 4-8 outputs per group 1.85-2.3x, 32 per group
# 1.56x, 64 per group 1.12-1.16x (int8_min_group_outputs 128: assumed to pay only beyond).  Before D172
# (the widening int16 route, D80) int8 paid only from 48 channels.
# Depthwise convs stay float on every plane (int8_depthwise_min_plane 0: the large-plane exception is for the
# VNNI depthwise kernel).
# int8_winograd_speedup where the int8 convs take the Winograd route (AVX2 without VNNI, D180).
INT8_WINOGRAD_SPEEDUP = 1.4
AVX2_INT8_RULES = {"int8_min_reduction": 24, "int8_min_window_reduction": 64, "int8_min_group_outputs": 128,
                   "int8_macs_per_float_mac": 1.6, "int8_depthwise_min_plane": 0, "int8_pair_limited_weights": True,
                   "int8_winograd_speedup": INT8_WINOGRAD_SPEEDUP}
# The int8 speed rules of an x86-64 host with AVX512-VNNI, measured on an Intel Xeon (model 167, 2-vCPU
# VM) at 1 thread, int8 / float of single layers (each followed by a float layer, D144): pointwise over
# 16 -> 96 channels at 112 x 112 1.19x, 16 -> 48 1.25x, 16 -> 16 1.7x (reduction 16: int8_min_reduction
# 24); 32 -> 16 at 112 x 112 1.22x, 64 -> 16 at 56 x 56 1.49x, 96 -> 24 1.17x, 72 -> 24 1.15x, 144 -> 24
# 0.92x (few outputs: int8_min_pointwise_outputs 32); 24 -> 72 0.97x, 24 -> 144 0.82x, 32 -> 192 at 28 x 28
# 0.70x, 64 -> 384 at 14 x 14 0.59x; the 3 x 3 stride-2 stem over 3 channels 1.09x (reduction 27:
# int8_min_window_reduction 32).  Whole models, int8 / float: MobileNetV2 0.84 -> 0.72, MobileNetV3-Large
# 0.79 -> 0.70, SqueezeNet 0.78 -> 0.69, RegNetY-400MF 0.83 -> 0.78 (the Zen 5 fit of D30 had 16 channels
# paying; these rules follow this host).  On large planes the pointwise threshold is higher (measured on an
# AMD Zen 4 with VNNI, D171): 32 -> 48 at 112 x 112 1.36x float (RegNetY-400MF), while 24 -> 144 at 56 x 56
# is 0.89x (MobileNetV2) and the 32 -> 48 stride-2 1 x 1 conv from 112 x 112 to 56 x 56 0.83x.
# Depthwise convs compute in int8 from 28 x 28 planes (56 x 56 when strided) on this host since the folded
# requantization (D181, D182): per call, uint8 in and out, 144 x 28 x 28 36 us against 50 in float, but 384 x
# 14 x 14 40 against 30; stride 2 from 56 x 56 66 against 50 (the parity split).  Whole models, int8 / float,
# depthwise int8 from 160 x 160 -> these planes: MobileNetV2 0.70 -> 0.58, MobileNetV3-Large 0.66 -> 0.60-0.63,
# ShuffleNetV2 0.57 -> 0.53, PP-OCR det 0.54 -> 0.53.  Strided ones from 28 x 28 too: MobileNetV2 0.59 -> 0.58,
# PP-OCR cls 0.93 -> 1.00 (its (2, 1)-strided convs), hence the separate threshold.
VNNI_INT8_RULES = {"int8_min_reduction": 24, "int8_min_window_reduction": 32, "int8_min_pointwise_outputs": 32,
                   "int8_large_plane": 112 * 112, "int8_min_large_plane_reduction": 48, "int8_chain_everywhere": True,
                   "int8_depthwise_min_plane": 28 * 28, "int8_depthwise_strided_min_plane": 56 * 56}
# float_winograd_speedup of a device whose float kernels take the Winograd path (AVX2's panels of 16, D178).
WINOGRAD_FLOAT_SPEEDUP = 1.5
# Without native kernels int8 layers dequantize and multiply in float: slower than float (assumed).
NO_NATIVE_INT8_MACS = 0.5
# int8_macs_per_float_mac where the int8 GEMM has a dot product (VNNI, SDOT): fitted on the Zen 5 VNNI
# host; for SDOT (4x the lanes of an FMA, as VNNI) assumed the same, not measured on a device.
DOT_PRODUCT_INT8_MACS = 2.5

_PROFILES = {
    p.name: p
    for p in (
        TargetProfile("generic", "any CPU (x86-64 or arm64), numpy kernels as baseline", ("cpu",), (), "any"),
        # Raspberry Pi OS 64-bit (Debian 12 arm64).  NEON (ASIMD) is part of
        # ARMv8-A, so every Pi has it; the ARMv8.2 dot-product (SDOT/UDOT) and
        # fp16 arithmetic instructions only arrived with the Pi 5's Cortex-A76.
        # Without dot products int8 still saves 4x memory and bandwidth, which
        # is what limits the A53/A72, so dynamic int8 is the default there;
        # on the A76 static int8 with SDOT is the fast path.
        TargetProfile("rpi3", "Raspberry Pi 3 (Cortex-A53, arm64)", ("cpu",), ("neon",), "linux",
                      arch="arm64", cpu="Cortex-A53 (BCM2837)", cores=4, simd_bits=128, llc_kb=512,
                      kernel_isas=("neon",), default_quantize="int8-dynamic", weight_pack=8, int8_depthwise_min_plane=0),
        TargetProfile("rpi4", "Raspberry Pi 4 (Cortex-A72, arm64)", ("cpu",), ("neon",), "linux",
                      arch="arm64", cpu="Cortex-A72 (BCM2711)", cores=4, simd_bits=128, llc_kb=1024,
                      kernel_isas=("neon",), default_quantize="int8-dynamic", weight_pack=8, int8_depthwise_min_plane=0),
        TargetProfile("rpi5", "Raspberry Pi 5 (Cortex-A76, arm64)", ("cpu",), ("neon", "dotprod", "fp16"), "linux",
                      arch="arm64", cpu="Cortex-A76 (BCM2712)", cores=4, simd_bits=128, llc_kb=2048,
                      kernel_isas=("neon-dotprod", "neon"), default_quantize="int8", weight_pack=8,
                      int8_depthwise_min_plane=0, int8_macs_per_float_mac=DOT_PRODUCT_INT8_MACS),
        # Raspberry Pi OS 32-bit (Debian 12 armhf), still on many Pi 2/3/Zero installs.  Debian's armhf
        # baseline is ARMv7 + VFPv3-D16 without NEON; the runtime wheel (make wheels, docs/packaging.md)
        # adds a NEON + VFPv4 copy of the float kernels, chosen at run time (every Pi from the Pi 2 on has
        # both: runtime feature names "neon" and "fma").  Float by default: the int8 GEMM is the portable C
        # one on 32-bit ARM (no NEON int8 kernel), assumed slower than the NEON float kernels.  Panels of 8,
        # as on arm64 (the same 4-lane float kernels).
        TargetProfile("rpi2", "Raspberry Pi 2 (Cortex-A7, 32-bit Raspberry Pi OS)", ("cpu",), ("neon", "fma"),
                      "linux", arch="armv7", cpu="Cortex-A7 (BCM2836)", cores=4, simd_bits=128, llc_kb=256,
                      kernel_isas=("neon", "baseline"), weight_pack=8, int8_depthwise_min_plane=0,
                      int8_macs_per_float_mac=0.5),
        TargetProfile("rpi3-armhf", "Raspberry Pi 3 on 32-bit Raspberry Pi OS (Cortex-A53 in AArch32)", ("cpu",),
                      ("neon", "fma"), "linux", arch="armv7", cpu="Cortex-A53 (BCM2837), AArch32", cores=4,
                      simd_bits=128, llc_kb=512, kernel_isas=("neon", "baseline"), weight_pack=8,
                      int8_depthwise_min_plane=0, int8_macs_per_float_mac=0.5),
        TargetProfile("rpi4-armhf", "Raspberry Pi 4 on 32-bit Raspberry Pi OS (Cortex-A72 in AArch32)", ("cpu",),
                      ("neon", "fma"), "linux", arch="armv7", cpu="Cortex-A72 (BCM2711), AArch32", cores=4,
                      simd_bits=128, llc_kb=1024, kernel_isas=("neon", "baseline"), weight_pack=8,
                      int8_depthwise_min_plane=0, int8_macs_per_float_mac=0.5),
        # Pi Zero / Pi 1 (ARM1176, ARMv6 + VFPv2, no NEON): Raspberry Pi OS's armhf is built for ARMv6, Debian's
        # is not, so no wheel is made here for it (docs/packaging.md): `minirt package --target rpi-zero` needs
        # --wheel with a wheel built on such a Pi (its kernels are the plain C baseline).
        TargetProfile("rpi-zero", "Raspberry Pi Zero / 1 (ARM1176, ARMv6, 32-bit Raspberry Pi OS)", ("cpu",), (),
                      "linux", arch="armv6", cpu="ARM1176JZF-S (BCM2835)", cores=1, simd_bits=0, llc_kb=128,
                      kernel_isas=("baseline",), weight_pack=8, int8_depthwise_min_plane=0,
                      int8_macs_per_float_mac=0.5),
        # Apple silicon and Android phones are arm64: the CPU fallback's NEON kernels read panels of 8.
        TargetProfile("macos", "Mac with Apple silicon", ("coreml", "cpu"), ("neon", "dotprod", "fp16"), "macos",
                      arch="arm64", simd_bits=128, kernel_isas=("neon-dotprod", "neon"), weight_pack=8,
                      int8_depthwise_min_plane=0, int8_macs_per_float_mac=DOT_PRODUCT_INT8_MACS),
        TargetProfile("ios", "iPhone / iPad", ("coreml", "cpu"), ("neon", "dotprod", "fp16"), "ios",
                      arch="arm64", simd_bits=128, kernel_isas=("neon-dotprod", "neon"), weight_pack=8,
                      int8_depthwise_min_plane=0, int8_macs_per_float_mac=DOT_PRODUCT_INT8_MACS),
        *(
            TargetProfile(f"android-api{level}", f"Android API level {level} (arm64)", ("nnapi", "cpu"), ("neon",), "android",
                          arch="arm64", simd_bits=128, kernel_isas=("neon",), weight_pack=8,
                          int8_depthwise_min_plane=0)
            for level in range(27, 35)
        ),
        # x86-64 PCs and servers by microarchitecture level (the psABI's names): v3 has AVX2 + FMA (panels
        # of 16 floats), v4 AVX-512 (panels of 32).  The runtime still picks its kernels from the CPU it
        # runs on; weights packed for another panel width are ignored there and packed on the first run.
        # v3 has no int8 dot product (VNNI): its int8 kernel multiplies int16 (D80), no faster than float FMAs,
        # so int8 pays only where the products are many per output (AVX2_INT8_RULES).
        TargetProfile("x86-64-v3", "x86-64 with AVX2 and FMA (Haswell / Zen and later)", ("cpu",), ("avx2", "fma"),
                      "linux", arch="x86_64", simd_bits=256, kernel_isas=("avx2",), weight_pack=16,
                      **AVX2_INT8_RULES),
        TargetProfile("x86-64-v4", "x86-64 with AVX-512 (Skylake-SP / Zen 4 and later)", ("cpu",),
                      ("avx2", "fma", "avx512f"), "linux", arch="x86_64", simd_bits=512,
                      kernel_isas=("avx512", "avx2"), weight_pack=32),
    )
}


# Core ML: ML Programs need Core ML 6 (model spec version 7): macOS 13 / iOS 16
# and later.  Apple silicon's Neural Engine computes in fp16, so both targets
# build fp16 programs; "compute_units" is the runtime default (overridable on
# the device with MINIRT_COREML_COMPUTE_UNITS).
_COREML = {
    "macos": {"deployment_target": "macOS13", "os_version": "13.0", "spec_version": 7,
              "compute_precision": "fp16", "compute_units": "all"},
    "ios": {"deployment_target": "iOS16", "os_version": "16.0", "spec_version": 7,
            "compute_precision": "fp16", "compute_units": "all"},
}
for _name, _info in _COREML.items():
    _PROFILES[_name] = dataclasses.replace(
        _PROFILES[_name], provider_info={**_PROFILES[_name].provider_info, "coreml": dict(_info)}
    )


# NNAPI: the Android API level decides which operations (and operand
# features) the NNAPI runtime accepts; the per-level op tables live in
# targets/nnapi/oplevels.py (``op_table()``, ``MIN_API_LEVEL``).
for _level in range(27, 35):
    _name = f"android-api{_level}"
    _PROFILES[_name] = dataclasses.replace(
        _PROFILES[_name],
        provider_info={**_PROFILES[_name].provider_info,
                       "nnapi": {"api_level": _level, "op_table": "minirt.targets.nnapi.oplevels:operations_at"}},
    )
del _level


def nnapi_api_level(profile) -> int | None:
    """The NNAPI (Android API) level of a target profile (or profile name), None for non-Android targets."""
    if isinstance(profile, str):
        profile = get_target(profile)
    return (getattr(profile, "provider_info", None) or {}).get("nnapi", {}).get("api_level")


def host_profile() -> TargetProfile:
    """The machine the builder runs on ("host"): a model built to run here, as benchmarks and local
    tests do.  Its packed-weight panel width is the one this machine's native kernels read (0 when
    they are not built); arm64 and x86-64 hosts otherwise take the generic profile's defaults."""
    import platform

    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "x86_64": "x86_64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "armv7",
            "armv8l": "armv7", "armv6l": "armv6"}.get(machine, "any")
    try:
        from minirt import native

        panels, features = native.packed_panel_width(), tuple(k for k, v in native.features.items() if v)
        # (the int8 kernel this machine runs decides its int8 speed rules and cost model)
        rules = AVX2_INT8_RULES if native.available and native.qgemm_isa == "avx2" else {}
        # (AMX machines run VNNI for every GEMM the tiles do not take: depthwise, narrow or small-K layers,
        # the rows left over; their rules stay the VNNI host's, measured without tiles)
        if native.available and native.qgemm_isa in ("vnni", "amx", "dotprod"):
            rules = {"int8_macs_per_float_mac": DOT_PRODUCT_INT8_MACS,
                     **(VNNI_INT8_RULES if native.qgemm_isa in ("vnni", "amx") else {})}
        elif not native.available:  # int8 layers then compute in float32 BLAS, after dequantizing
            rules = {"int8_macs_per_float_mac": NO_NATIVE_INT8_MACS}
        if panels == 16:  # (AVX2's float kernels: Winograd 3x3 convs, D178)
            rules = {**rules, "float_winograd_speedup": WINOGRAD_FLOAT_SPEEDUP}
    except Exception:  # noqa: BLE001 - no native kernels: nothing to pack for, the generic int8 rules
        panels, features, rules = 0, (), {}
    return dataclasses.replace(_PROFILES["generic"], name="host", description=f"this machine ({machine})",
                               cpu_features=features, arch=arch, weight_pack=panels, **rules)


def get_target(name: str) -> TargetProfile:
    """The profile called ``name``; ValueError listing the known names otherwise."""
    if name == "host":
        return host_profile()
    try:
        return _PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; known targets: {', '.join(target_names())}") from None


def target_names() -> list[str]:
    return [*_PROFILES, "host"]
