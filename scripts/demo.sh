#!/usr/bin/env bash
# The main job: builds svnic and runs `svnic demo` — the backend and two host-process guests in
# one command, comparing the bypass channel with the virtio-net path. Extra arguments go to
# `svnic demo` (e.g. --json, --rounds 5000, --messages 5000000, --no-pin).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
RUST_LOG=${RUST_LOG:-warn} exec cargo run --quiet --release --bin svnic -- demo "$@"
