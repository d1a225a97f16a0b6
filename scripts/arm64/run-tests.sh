#!/usr/bin/env bash
# `make test-arm64`: the runtime on an emulated Raspberry Pi (Debian bookworm arm64).
#
#   1. build or reuse the cached root filesystem (scripts/arm64/rootfs.sh)
#   2. on the host: build the subset's .mrt artifacts and onnxruntime's
#      expected outputs (tests/arm64/prepare.py, needs the dev venv)
#   3. copy the checkout into the chroot, pip install it with Debian's
#      python3 (--no-deps: Debian's numpy 1.24 stays; the native kernels are
#      compiled by Debian's gcc), print `python3 -m minirt info`
#   4. run the subset with pytest inside (tests/arm64, tests/test_numpy_compat.py,
#      tests/test_raspberry_pi_examples.py), then time the demo model
#   5. reinstall with no working C compiler: the install must succeed and the
#      runtime fall back to its numpy kernels
#
# Mounts are undone by a trap on every exit path, failures included.
#
# Environment:
#   PYTHON                      host python with the dev extra (default .venv/bin/python)
#   MINIRT_ARM64_CACHE          cache folder (default /var/cache/minirt-arm64)
#   MINIRT_ARM64_EXPECT_NATIVE  1 (default): the native kernels must build and load inside
#   MINIRT_ARM64_BUILD_ISOLATION 0 (default): build with Debian's setuptools/cffi,
#                               no network needed; 1: pip's isolated build env from PyPI
#   MINIRT_ARM64_PYTEST_ARGS    extra pytest arguments (e.g. -k digits)
#   MINIRT_ARM64_BENCH_RUNS     timed runs of the demo model (default 200; 0 skips)
#   MINIRT_ARM64_NOCC_CHECK     1 (default): finally install again with CC=false (into a
#                               separate folder) and check the numpy-kernel fallback
#   MINIRT_ARM64_CPU            qemu CPU model for the tests (default cortex-a72 = Pi 4;
#                               cortex-a53 = Pi 3, cortex-a76 = Pi 5; the per-CPU
#                               dispatch test covers all three either way)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

# The whole script is one function, read completely before it starts: editing
# this file while a run is going on cannot change what that run does.
main() {
    PYTHON="${PYTHON:-$repo/.venv/bin/python}"
    EXPECT_NATIVE="${MINIRT_ARM64_EXPECT_NATIVE:-1}"
    BUILD_ISOLATION="${MINIRT_ARM64_BUILD_ISOLATION:-0}"
    BENCH_RUNS="${MINIRT_ARM64_BENCH_RUNS:-200}"
    CPU="${MINIRT_ARM64_CPU:-cortex-a72}"  # qemu's CPU model for the main run: a Pi 4
    NOCC_CHECK="${MINIRT_ARM64_NOCC_CHECK:-1}"

    need_root
    [ -x "$PYTHON" ] || die "no host python at $PYTHON (run 'make test' first, or set PYTHON=)"

    t_start=$SECONDS
    "$here/rootfs.sh" >/dev/null
    t_rootfs=$SECONDS
    ensure_binfmt

    # One run at a time per cache (the root filesystem is shared).
    exec 8>"$MINIRT_ARM64_CACHE/.run-lock"
    flock -w 3600 8 || die "another test-arm64 run holds $MINIRT_ARM64_CACHE/.run-lock"

    root="$ARM64_ROOTFS"
    stage="$root/opt/minirt"
    umount_stale "$root"

    cleanup() {
        local status=$?
        umount_chroot
        umount_stale "$root"
        if [ "$status" -ne 0 ]; then
            log "FAILED (exit status $status); logs in $MINIRT_ARM64_CACHE/*.log"
        fi
        exit "$status"
    }
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    # --- 2. host side: artifacts and expected outputs -------------------------
    rm -rf "$stage"
    mkdir -p "$stage/src" "$stage/tests" "$stage/artifacts"
    log "building the test artifacts on the host ($PYTHON)"
    (cd "$repo" && "$PYTHON" -m tests.arm64.prepare "$stage/artifacts") >&2

    # --- 3. the checkout, as pip would get it ---------------------------------
    copy_tree() {  # files git knows about (tracked or new, not ignored) -> $1
        local dest="$1"
        if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
            (cd "$repo" && git ls-files -co --exclude-standard -z \
                | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
                | tar --null -T - -cf -) | tar -xf - -C "$dest"
        else
            tar -C "$repo" --exclude=.venv --exclude=.git --exclude=build --exclude='*.egg-info' \
                --exclude='_kernels*.so' --exclude=__pycache__ -cf - . | tar -xf - -C "$dest"
        fi
    }
    copy_tree "$stage/src"
    # The tests run from their own folder, so `import minirt` finds the installed
    # package (with its compiled kernels), not the source copy.
    mkdir -p "$stage/tests/tests" "$stage/tests/examples"
    cp "$repo/tests/__init__.py" "$repo/tests/test_numpy_compat.py" "$repo/tests/test_raspberry_pi_examples.py" \
        "$stage/tests/tests/"
    cp -r "$repo/tests/arm64" "$stage/tests/tests/arm64"
    cp -r "$repo/examples/raspberry_pi" "$stage/tests/examples/raspberry_pi"
    mkdir -p "$stage/tests/examples/digits"
    cp "$repo/examples/digits/heldout.npz" "$stage/tests/examples/digits/"
    rm -f "$stage/tests/examples/raspberry_pi/digits.mrt"
    find "$stage" -name __pycache__ -type d -prune -exec rm -rf {} +
    cp "$here/native_report.py" "$here/install_size.py" "$stage/"
    printf '[pytest]\naddopts = -ra -p no:cacheprovider\n' > "$stage/tests/pytest.ini"

    mount_chroot "$root"
    copy_ca_certs "$root"
    update_ca_certs "$root"

    pip_flags=(--break-system-packages --no-deps --no-cache-dir --disable-pip-version-check --no-input)
    [ "$BUILD_ISOLATION" = 1 ] || pip_flags+=(--no-build-isolation)
    log "pip install minirt inside the chroot (Debian python3, gcc; ${pip_flags[*]})"
    t0=$SECONDS
    in_chroot "$root" python3 -m pip uninstall -y --break-system-packages minirt >/dev/null 2>&1 || true
    if ! in_chroot "$root" python3 -m pip install -v "${pip_flags[@]}" /opt/minirt/src \
            > "$MINIRT_ARM64_CACHE/pip-install.log" 2>&1; then
        tail -n 60 "$MINIRT_ARM64_CACHE/pip-install.log" >&2
        die "pip install failed inside the chroot"
    fi
    t_pip=$((SECONDS - t0))
    # What the compiler did (the extension is optional: a failure only warns).
    grep -E "aarch64-linux-gnu-gcc|^gcc|building '|error:|warning: building|failed" \
        "$MINIRT_ARM64_CACHE/pip-install.log" | sed 's/^/  pip: /' | cut -c1-240 | head -n 20 >&2 || true
    log "pip install took ${t_pip} s"

    echo "=== python3 -m minirt info (emulated arm64, QEMU_CPU=$CPU) ==="
    in_chroot "$root" sh -c "cd /opt/minirt/tests && QEMU_CPU=$CPU python3 -m minirt info"
    echo "--- native kernels per Raspberry Pi CPU (one install, chosen at run time) ---"
    for cpu in cortex-a53:rpi3 cortex-a72:rpi4 cortex-a76:rpi5; do
        in_chroot "$root" sh -c "QEMU_CPU=${cpu%%:*} python3 /opt/minirt/native_report.py ${cpu#*:}"
    done
    in_chroot "$root" sh -c "cd /opt/minirt/tests && python3 /opt/minirt/install_size.py"
    echo "================================================"

    numpy_version="$(in_chroot "$root" dpkg-query -W -f='${Version}' python3-numpy | sed -E 's/^[0-9]+://; s/-.*//')"

    # --- 4. the tests ---------------------------------------------------------
    log "running the runtime subset under emulation (Debian numpy $numpy_version)"
    t0=$SECONDS
    status=0
    # shellcheck disable=SC2086
    in_chroot "$root" sh -c "cd /opt/minirt/tests && \
        QEMU_CPU=$CPU MINIRT_ARM64_EMULATED=1 MINIRT_ARM64_ARTIFACTS=/opt/minirt/artifacts \
        MINIRT_PI_DIGITS_MODEL=/opt/minirt/artifacts/digits_rpi4.mrt \
        MINIRT_EXPECT_NATIVE=$EXPECT_NATIVE MINIRT_EXPECT_NUMPY=$numpy_version \
        python3 -m pytest -q --tb=short tests/arm64 tests/test_numpy_compat.py tests/test_raspberry_pi_examples.py \
        ${MINIRT_ARM64_PYTEST_ARGS:-}" || status=$?
    t_tests=$((SECONDS - t0))

    if [ "$status" -eq 0 ] && [ "$BENCH_RUNS" -gt 0 ]; then
        echo "=== demo model latency under emulation (examples/raspberry_pi/benchmark.py) ==="
        in_chroot "$root" sh -c "cd /opt/minirt/tests/examples/raspberry_pi && QEMU_CPU=$CPU \
            python3 benchmark.py --model /opt/minirt/artifacts/digits_rpi4.mrt --runs $BENCH_RUNS --warmup 5 --compare-numpy" \
            || log "benchmark failed (not a test failure)"
    fi

    # --- 5. no compiler: the install must still work, on numpy kernels ---------
    # Into a separate folder (pip --target), so the chroot keeps its native install.
    if [ "$status" -eq 0 ] && [ "$NOCC_CHECK" = 1 ]; then
        log "pip install again with no working C compiler (CC=false): must fall back to the numpy kernels"
        t0=$SECONDS
        rm -rf "$stage/src/build" "$stage/nocc"
        if ! in_chroot "$root" env CC=false python3 -m pip install -v --target /opt/minirt/nocc "${pip_flags[@]}" \
                /opt/minirt/src > "$MINIRT_ARM64_CACHE/pip-install-nocc.log" 2>&1; then
            tail -n 40 "$MINIRT_ARM64_CACHE/pip-install-nocc.log" >&2
            log "pip install without a compiler FAILED"
            status=1
        elif ! in_chroot "$root" sh -c "cd /opt/minirt/tests/examples/raspberry_pi && export PYTHONPATH=/opt/minirt/nocc && \
                python3 -c 'import minirt.native as n; print(\"no compiler:\", n.describe()); assert not n.available' && \
                python3 classify.py --model /opt/minirt/artifacts/digits_rpi4.mrt samples/digit_3.png samples/digit_8.png"; then
            log "the no-compiler install does not run on the numpy kernels"
            status=1
        fi
        t_nocc=$((SECONDS - t0))
        rm -rf "$stage/src/build" "$stage/nocc"
    fi

    log "times: root filesystem $((t_rootfs - t_start)) s, pip install ${t_pip} s, tests ${t_tests} s, no-compiler check ${t_nocc:-0} s, total $((SECONDS - t_start)) s"
    if [ "$status" -ne 0 ]; then
        die "the arm64 tests failed (pytest exit status $status)"
    fi
    log "OK"
}

main "$@"
exit
