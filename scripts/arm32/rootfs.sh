#!/usr/bin/env bash
# scripts/emulated/rootfs.sh for the emulated arm32 Raspberry Pi (see scripts/emulated/README.md).
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../emulated/rootfs.sh" arm32 "$@"
