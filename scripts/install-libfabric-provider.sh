#!/usr/bin/env bash
# Builds the svnic libfabric provider and installs it as DEST/libsvnic-fi.so, where libfabric
# finds it with FI_PROVIDER_PATH=DEST (docs/libfabric.md).
#
#   scripts/install-libfabric-provider.sh [--release] [DEST]
#
# DEST defaults to $SVNIC_PREFIX/lib/libfabric (SVNIC_PREFIX defaults to ~/.local). Honours
# CARGO and CARGO_TARGET_DIR like cargo itself.
set -euo pipefail

profile=debug
args=()
if [ "${1:-}" = --release ]; then
    profile=release
    args+=(--release)
    shift
fi
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-${SVNIC_PREFIX:-$HOME/.local}/lib/libfabric}
cargo=${CARGO:-cargo}
target=${CARGO_TARGET_DIR:-$root/target}

(cd "$root" && "$cargo" build -q "${args[@]}" -p svnic-libfabric --lib)
lib=$target/$profile/libsvnic_fi.so
[ -f "$lib" ] || { echo "install-libfabric-provider: $lib was not built" >&2; exit 1; }
mkdir -p "$dest"
# Copy to a temporary name and rename, so that a process loading the provider never sees a
# half-written file.
cp "$lib" "$dest/.libsvnic-fi.so.$$"
mv -f "$dest/.libsvnic-fi.so.$$" "$dest/libsvnic-fi.so"
echo "installed $dest/libsvnic-fi.so; use: export FI_PROVIDER_PATH=$dest FI_PROVIDER=svnic"
