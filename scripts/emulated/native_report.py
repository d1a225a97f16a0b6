"""Print which native kernels minirt built and chose on this CPU (run inside the chroot).

    QEMU_CPU=cortex-a72 python3 native_report.py rpi4
"""
import os
import platform
import sys

import numpy as np

from minirt import native

label = sys.argv[1] if len(sys.argv) > 1 else platform.machine()
cpu = os.environ.get("QEMU_CPU", "default")
feats = ", ".join(k for k, v in native.features.items() if v) or "none"
print(f"{label:<5} ({cpu}): available={native.available} isa={native.isa} int8_gemm={native.qgemm_isa} "
      f"features=[{feats}] "
      f"numpy={np.__version__}{'' if native.available else ' reason=' + native.reason}")
