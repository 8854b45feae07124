#!/usr/bin/env bash
# The whole svnic test suite, from a fresh machine: installs what the tests need, then runs
# formatting and lint checks and every test of the workspace. This is README.md's test command
# and what CI (.ci/run) calls.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

echo "== guest image for the VM tests (vm-images/build.sh; cached, see docs/vm.md)"
vm-images/build.sh --build-guest --libfabric

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== module cycles (scripts/check-module-cycles.py)"
python3 scripts/check-module-cycles.py

echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings
# The bench-only timing of DMA-data copies (feature dma-timing, off in normal builds).
cargo clippy -p svnic-backend --features dma-timing --all-targets -- -D warnings

echo "== cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

echo "== cargo test"
cargo test --workspace
cargo test -p svnic-backend --features dma-timing --lib dma_timing

echo "== fuzz targets, FUZZ_SECONDS (default 45) each (skipped, and said so, without nightly)"
scripts/fuzz-ci.sh

echo "== svnic demo --json (release build; numbers are reported, never asserted)"
RUST_LOG=warn cargo run --quiet --release -p svnic --bin svnic -- demo --json
