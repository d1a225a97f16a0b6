#!/usr/bin/env bash
# scripts/emulated/shell.sh for the emulated arm64 Raspberry Pi (see scripts/emulated/README.md).
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../emulated/shell.sh" arm64 "$@"
