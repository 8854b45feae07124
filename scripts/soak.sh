#!/usr/bin/env bash
# The soak of issue 13: 64 host-process guests x 16 channels against one `svnic serve` (release
# build, its own process) for MINUTES (default 10), with random channel creates and destroys,
# user-data and DMA-data between guests, and a guest SIGKILLed and restarted every 2 s. At the
# end the daemon must still be the same process, every counter must balance exactly, its RSS
# and fds must be back near their baseline, and SIGTERM must end it within 5 s. Prints the
# figures. Extra options go to `svnic-soak run` (e.g. --guests 8 --channels 4 --seed 7).
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=${1:-10}
if ! [[ $minutes =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/soak.sh [MINUTES] [svnic-soak run options]" >&2
    exit 2
fi
shift $(($# > 0 ? 1 : 0))

cargo build --release --bin svnic --bin svnic-soak
target=${CARGO_TARGET_DIR:-target}
exec "$target/release/svnic-soak" run --svnic "$target/release/svnic" \
    --seconds $((minutes * 60)) "$@"
