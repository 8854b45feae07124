#!/usr/bin/env bash
# Compares two revisions on `svnic demo`: builds the `svnic` binary of each (in temporary
# worktrees, sharing target/ab, each binary copied out once built), then
# runs `svnic demo --json` alternately, A then B, for ROUNDS rounds, and prints every row's
# figures for both, round by round (round trip p50 in us, streaming in M messages/s). This host's
# pace changes over seconds to minutes, so only runs made alternately compare.
#
#   scripts/research/demo-ab.sh REV_A REV_B [ROUNDS] [-- DEMO-ARGS...]
#
# Default 3 rounds of `svnic demo --json --rounds 3000 --messages 2000000` (about 30 s each).
# Afterwards target/ab/release/svnic is REV_B's build.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/research/ab-lib.sh
[ $# -ge 2 ] || { sed -n '2,11p' "$0" >&2; exit 2; }
rev_a=$1 rev_b=$2
shift 2
rounds=3
if [ $# -gt 0 ] && [ "$1" != -- ]; then rounds=$1; shift; fi
ab_rounds demo-ab "$rounds"
[ "${1:-}" = -- ] && shift
demo_args=("$@")
[ ${#demo_args[@]} -gt 0 ] || demo_args=(--rounds 3000 --messages 2000000)
ab_setup
for x in a b; do
    ab_worktree $x "$([ $x = a ] && echo "$rev_a" || echo "$rev_b")"
    (cd "$work/$x" && cargo build --quiet --release --bin svnic)
    cp "$CARGO_TARGET_DIR/release/svnic" "$work/svnic-$x"
done
for r in $(seq "$rounds"); do
    for x in a b; do
        RUST_LOG=warn "$work/svnic-$x" demo --json "${demo_args[@]}" >"$work/$r-$x.json"
    done
done
python3 - "$work" "$rounds" <<'PY'
import json, sys
work, rounds = sys.argv[1], int(sys.argv[2])
runs = {x: [json.load(open(f"{work}/{r}-{x}.json")) for r in range(1, rounds + 1)] for x in "ab"}
rows = [("round trip p50 (us)", "round_trip", k, "p50_us", 1) for k in
        ("bypass_user_data_32", "bypass_dma_data_4096", "bypass_user_data_32_thread_per_guest",
         "virtio_net_32")]
rows += [("streaming (M msgs/s)", "streaming", k, "messages_per_sec", 1e-6) for k in
         ("bypass_user_data", "bypass_user_data_thread_per_guest", "virtio_net")]
print(f"{'row':<58} {'A':<24} {'B':<24}")
for title, group, key, field, scale in rows:
    cells = [" ".join(f"{run[group][key][field] * scale:.2f}" for run in runs[x]) for x in "ab"]
    print(f"{title + ', ' + key:<58} {cells[0]:<24} {cells[1]:<24}")
PY
