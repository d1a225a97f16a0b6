#!/usr/bin/env bash
# `make test-arm64` / `make test-arm32`: the runtime on an emulated Raspberry Pi, Debian bookworm arm64
# or armhf (scripts/emulated/common.sh).
#
#   scripts/emulated/run-tests.sh arm64|arm32
#
#   1. build or reuse the cached roots (rootfs.sh): the build root and the device root
#   2. the runtime wheel: `pip wheel` of the checkout inside the build root (MINIRT_WHEEL=runtime,
#      Debian's gcc compiles the kernels), or the one given in MINIRT_<ARCH>_WHEEL (e.g. from `make wheels`)
#   3. on the host: the subset's .mrt artifacts and onnxruntime's expected outputs
#      (tests/arm64/prepare.py), and `minirt package` of a real model and an int8 model with that wheel
#   4. `pip install` of the wheel in the build root (--no-deps: Debian's numpy 1.24 stays), `python3 -m
#      minirt info`, the kernels chosen on each emulated CPU, the installed size
#   5. the subset with pytest (tests/arm64, tests/test_numpy_compat.py, tests/test_raspberry_pi_examples.py),
#      then the demo model's latency
#   6. the device: a fresh copy of the device root (python3, Debian's numpy, python3-venv: NO compiler),
#      `sh install.sh` of each package (offline), `.venv/bin/python run.py run INPUT.npz --out OUT.npz`,
#      the outputs compared on the host with onnxruntime's (prepare.py compare); installed sizes and
#      install times
#   7. a source install with no working C compiler (CC=false): it must succeed and the runtime fall
#      back to its numpy kernels, saying so
#
# Mounts are undone by a trap on every exit path, failures included.
#
# Environment (ARCH is ARM64 or ARM32):
#   PYTHON                       host python with the dev extra (default .venv/bin/python)
#   MINIRT_<ARCH>_CACHE          cache folder (default /var/cache/minirt-arm64, /var/cache/minirt-arm32)
#   MINIRT_<ARCH>_WHEEL          a runtime wheel to test instead of building one (e.g. dist/minirt-*-linux_armv7l.whl)
#   MINIRT_<ARCH>_EXPECT_NATIVE  1 (default): the native kernels must be in the wheel and active
#   MINIRT_<ARCH>_PYTEST_ARGS    extra pytest arguments (e.g. -k digits)
#   MINIRT_<ARCH>_BENCH_RUNS     timed runs of the demo model (default 200; 0 skips)
#   MINIRT_<ARCH>_DEVICE_CHECK   1 (default): step 6
#   MINIRT_<ARCH>_NOCC_CHECK     1 (default): step 7
#   MINIRT_<ARCH>_CPU            qemu CPU model for the tests (default: cortex-a72 = Pi 4 on arm64,
#                                cortex-a7 = Pi 2 on arm32; the per-CPU dispatch test covers the others)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

# The whole script is one function, read completely before it starts: editing this file while a run
# is going on cannot change what that run does.
main() {
    emu_setup "${1:-}"
    PYTHON="${PYTHON:-$repo/.venv/bin/python}"
    EXPECT_NATIVE="$(emu_env EXPECT_NATIVE 1)"
    BENCH_RUNS="$(emu_env BENCH_RUNS 200)"
    CPU="$(emu_env CPU "${EMU_CPUS[0]%%:*}")"
    DEVICE_CHECK="$(emu_env DEVICE_CHECK 1)"
    NOCC_CHECK="$(emu_env NOCC_CHECK 1)"
    GIVEN_WHEEL="$(emu_env WHEEL "")"
    PYTEST_ARGS="$(emu_env PYTEST_ARGS "")"

    need_root
    [ -x "$PYTHON" ] || die "no host python at $PYTHON (run 'make test' first, or set PYTHON=)"
    [ -z "$GIVEN_WHEEL" ] || [ -f "$GIVEN_WHEEL" ] || die "MINIRT_${EMU_VAR}_WHEEL=$GIVEN_WHEEL: no such file"

    t_start=$SECONDS
    "$here/rootfs.sh" "$EMU_NAME" >/dev/null
    t_rootfs=$SECONDS
    ensure_binfmt

    # One run at a time per cache (the roots are shared).
    exec 8>"$EMU_CACHE/.run-lock"
    flock -w 3600 8 || die "another run holds $EMU_CACHE/.run-lock"

    root="$EMU_ROOTFS"
    stage="$root/opt/minirt"
    device="$EMU_CACHE/device-run"
    umount_stale "$root"
    umount_stale "$device"

    cleanup() {
        local status=$?
        umount_chroot
        umount_stale "$root"
        umount_stale "$device"
        if [ "$status" -ne 0 ]; then
            log "FAILED (exit status $status); logs in $EMU_CACHE/*.log"
        fi
        exit "$status"
    }
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    # --- the checkout, as pip would get it; the test files ----------------------------------
    rm -rf "$stage"
    mkdir -p "$stage/tests" "$stage/artifacts" "$stage/packages"
    copy_checkout "$repo" "$stage/src"
    # The tests run from their own folder, so `import minirt` finds the installed package (with its
    # compiled kernels), not the source copy.
    mkdir -p "$stage/tests/tests" "$stage/tests/examples"
    cp "$repo/tests/__init__.py" "$repo/tests/test_numpy_compat.py" "$repo/tests/test_raspberry_pi_examples.py" \
        "$stage/tests/tests/"
    cp -r "$repo/tests/arm64" "$stage/tests/tests/arm64"
    cp -r "$repo/examples/raspberry_pi" "$stage/tests/examples/raspberry_pi"
    mkdir -p "$stage/tests/examples/digits"
    cp "$repo/examples/digits/heldout.npz" "$stage/tests/examples/digits/"
    rm -f "$stage/tests/examples/raspberry_pi/digits.mrt"
    find "$stage/tests" -name __pycache__ -type d -prune -exec rm -rf {} +
    cp "$here/native_report.py" "$here/install_size.py" "$stage/"
    printf '[pytest]\naddopts = -ra -p no:cacheprovider\n' > "$stage/tests/pytest.ini"

    mount_chroot "$root"
    copy_ca_certs "$root"
    update_ca_certs "$root"

    # --- 2. the wheel -------------------------------------------------------------------------
    t_wheel=0
    if [ -n "$GIVEN_WHEEL" ]; then
        mkdir -p "$stage/dist"
        cp "$GIVEN_WHEEL" "$stage/dist/"
        wheel="$stage/dist/$(basename "$GIVEN_WHEEL")"
        log "testing the given wheel $(basename "$wheel")"
    else
        build_wheel_inside "$root"
        wheel="$EMU_WHEEL"
        t_wheel=$EMU_WHEEL_SECONDS
    fi
    case "$(basename "$wheel")" in
        *"_$EMU_WHEEL_TAG.whl") ;;
        *) die "$(basename "$wheel") is not a $EMU_WHEEL_TAG wheel" ;;
    esac

    # --- 3. host side: artifacts, expected outputs, packages -----------------------------------
    log "building the test artifacts and packages on the host ($PYTHON)"
    (cd "$repo" && "$PYTHON" -m tests.arm64.prepare "$stage/artifacts" --arch "$EMU_NAME") >&2
    if [ "$DEVICE_CHECK" = 1 ]; then
        (cd "$repo" && "$PYTHON" -m tests.arm64.prepare package "$stage/artifacts" "$stage/packages" --wheel "$wheel") >&2
    fi

    # --- 4. the wheel installed in the build root ------------------------------------------------
    pip_flags=(--break-system-packages --no-deps --no-cache-dir --disable-pip-version-check --no-input)
    in_chroot "$root" python3 -m pip uninstall -y --break-system-packages minirt >/dev/null 2>&1 || true
    t0=$SECONDS
    if ! in_chroot "$root" python3 -m pip install -v "${pip_flags[@]}" "/opt/minirt/dist/$(basename "$wheel")" \
            > "$EMU_CACHE/pip-install.log" 2>&1; then
        tail -n 60 "$EMU_CACHE/pip-install.log" >&2
        die "pip install of the wheel failed inside the chroot"
    fi
    t_pip=$((SECONDS - t0))
    log "pip install of the wheel took ${t_pip} s"

    echo "=== python3 -m minirt info (emulated $EMU_DEB_ARCH, QEMU_CPU=$CPU) ==="
    in_chroot "$root" sh -c "cd /opt/minirt/tests && QEMU_CPU=$CPU python3 -m minirt info"
    echo "--- native kernels per CPU (one install, chosen at run time) ---"
    for cpu in "${EMU_CPUS[@]}"; do
        in_chroot "$root" sh -c "QEMU_CPU=${cpu%%:*} python3 /opt/minirt/native_report.py ${cpu#*:}"
    done
    in_chroot "$root" sh -c "cd /opt/minirt/tests && python3 /opt/minirt/install_size.py"
    echo "================================================"

    numpy_version="$(in_chroot "$root" dpkg-query -W -f='${Version}' python3-numpy | sed -E 's/^[0-9]+://; s/-.*//')"

    # --- 5. the tests -------------------------------------------------------------------------
    log "running the runtime subset under emulation (Debian numpy $numpy_version)"
    t0=$SECONDS
    status=0
    # shellcheck disable=SC2086
    in_chroot "$root" sh -c "cd /opt/minirt/tests && \
        QEMU_CPU=$CPU MINIRT_ARM64_EMULATED=1 MINIRT_ARM64_ARTIFACTS=/opt/minirt/artifacts \
        MINIRT_ARM64_DIFFS=/opt/minirt/diffs.txt MINIRT_PI_DIGITS_MODEL=/opt/minirt/artifacts/digits_rpi4.mrt \
        MINIRT_EXPECT_NATIVE=$EXPECT_NATIVE MINIRT_EXPECT_NUMPY=$numpy_version \
        python3 -m pytest -q --tb=short tests/arm64 tests/test_numpy_compat.py tests/test_raspberry_pi_examples.py \
        $PYTEST_ARGS" || status=$?
    t_tests=$((SECONDS - t0))
    if [ -s "$stage/diffs.txt" ]; then
        echo "=== measured differences (QEMU_CPU=$CPU; docs/packaging.md, \"Tolerances\") ==="
        sed 's/^/  /' "$stage/diffs.txt"
    fi

    if [ "$status" -eq 0 ] && [ "$BENCH_RUNS" -gt 0 ]; then
        echo "=== demo model latency under emulation (examples/raspberry_pi/benchmark.py) ==="
        in_chroot "$root" sh -c "cd /opt/minirt/tests/examples/raspberry_pi && QEMU_CPU=$CPU \
            python3 benchmark.py --model /opt/minirt/artifacts/digits_rpi4.mrt --runs $BENCH_RUNS --warmup 5 --compare-numpy" \
            || log "benchmark failed (not a test failure)"
    fi
    umount_chroot

    # --- 6. the device: no compiler, the packages installed as a Pi user does ------------------
    t_device=0
    if [ "$status" -eq 0 ] && [ "$DEVICE_CHECK" = 1 ]; then
        t0=$SECONDS
        device_check "$device" "$stage" || status=$?
        t_device=$((SECONDS - t0))
    fi

    # --- 7. no compiler: a source install must still work, on numpy kernels ---------------------
    # Into a separate folder (pip --target), so the build root keeps the wheel's install.
    t_nocc=0
    if [ "$status" -eq 0 ] && [ "$NOCC_CHECK" = 1 ]; then
        mount_chroot "$root"
        log "pip install from source with no working C compiler (CC=false): must fall back to the numpy kernels"
        t0=$SECONDS
        rm -rf "$stage/src/build" "$stage/nocc"
        if ! in_chroot "$root" env CC=false python3 -m pip install -v --target /opt/minirt/nocc \
                "${pip_flags[@]}" --no-build-isolation /opt/minirt/src > "$EMU_CACHE/pip-install-nocc.log" 2>&1; then
            tail -n 40 "$EMU_CACHE/pip-install-nocc.log" >&2
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
        umount_chroot
    fi

    log "times: root filesystems $((t_rootfs - t_start)) s, wheel build ${t_wheel} s, pip install of the wheel" \
        "${t_pip} s, tests ${t_tests} s, device check ${t_device} s, no-compiler check ${t_nocc} s," \
        "total $((SECONDS - t_start)) s"
    if [ "$status" -ne 0 ]; then
        die "the $EMU_NAME tests failed (exit status $status)"
    fi
    log "OK"
}

# Step 6: a fresh copy of the device root; each package of $stage/packages installed with its own
# install.sh (offline: a venv over Debian's numpy, the wheel with pip --no-index), run on its input, and
# its outputs compared on the host.  Returns non-zero on any failure.
device_check() {
    local device="$1" stage="$2" pkg name t0 t_install rc=0
    umount_stale "$device"
    rm -rf "$device"
    cp -a "$EMU_DEVICE" "$device"
    if in_chroot "$device" sh -c 'command -v gcc cc c99 tcc clang' >/dev/null 2>&1; then
        log "the device root has a C compiler: it must not"
        return 1
    fi
    mkdir -p "$device/opt/packages"
    cp -a "$stage/packages/." "$device/opt/packages/"
    mount_chroot "$device"
    echo "=== device: Debian $EMU_SUITE $EMU_DEB_ARCH, ${EMU_DEVICE_PACKAGES[*]}; no compiler ==="
    for pkg in "$device"/opt/packages/*/; do
        name="$(basename "$pkg")"
        t0=$SECONDS
        if ! in_chroot "$device" sh -c "cd /opt/packages/$name && QEMU_CPU=$CPU sh install.sh" \
                > "$EMU_CACHE/device-install-$name.log" 2>&1; then
            cat "$EMU_CACHE/device-install-$name.log" >&2
            log "device: sh install.sh of $name FAILED"
            rc=1
            continue
        fi
        t_install=$((SECONDS - t0))
        sed 's/^/  /' "$EMU_CACHE/device-install-$name.log"
        if [ "$EXPECT_NATIVE" = 1 ] && ! grep -q "native kernels: active" "$EMU_CACHE/device-install-$name.log"; then
            log "device: $name runs without the native kernels (see run.py info above)"
            rc=1
        fi
        echo "device: sh install.sh of $name took ${t_install} s"
        if ! in_chroot "$device" sh -c "cd /opt/packages/$name && QEMU_CPU=$CPU .venv/bin/python run.py run \
                ../$name.input.npz --out /opt/packages/$name.out.npz"; then
            log "device: run.py run of $name FAILED"
            rc=1
            continue
        fi
        (cd "$repo" && "$PYTHON" -m tests.arm64.prepare compare "$stage/artifacts" "$name" \
            "$device/opt/packages/$name.out.npz") || rc=1
        # the installed runtime: the minirt folder of the venv, with the bytecode pip compiled and without it
        in_chroot "$device" sh -c "cd /opt/packages/$name/.venv/lib/python3*/site-packages/minirt && \
            echo device: installed runtime \$(du -sb . | cut -f1) bytes with bytecode, \
\$(du -sb --exclude=__pycache__ . | cut -f1) without"
    done
    umount_chroot
    rm -rf "$device"
    return "$rc"
}

main "$@"
exit
