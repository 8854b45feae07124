#!/usr/bin/env bash
# Runs every fuzz target (fuzz/) for a bounded time on its committed seeds, as CI does: needs a
# nightly toolchain (cargo-fuzz is installed from crates.io when missing); without one it says
# that fuzzing was skipped and why, and succeeds. Fails if any target crashes (a panic, a
# signal, a leak or a timeout of one input); each crashing input is printed in base64.
#
#   scripts/fuzz-ci.sh            # FUZZ_SECONDS per target (default 45)
#   FUZZ_SECONDS=300 scripts/fuzz-ci.sh
#
# The seeds are copied to a temporary directory, so the checkout stays clean. Environment
# variables of the targets (e.g. SVNIC_FUZZ_NO_TRUNCATE=1, see fuzz/README.md) pass through.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${FUZZ_SECONDS:-45}
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
    echo "fuzz-ci: FUZZ_SECONDS must be a positive integer, not '$seconds'" >&2
    exit 2
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "== fuzzing SKIPPED: no nightly toolchain (cargo-fuzz needs one; install it with" \
        "'rustup toolchain install nightly' to run the fuzz targets here)"
    exit 0
fi

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz (cargo +nightly install cargo-fuzz --locked)"
    cargo +nightly install cargo-fuzz --locked
fi

echo "== cargo +nightly fuzz build (all targets)"
cargo +nightly fuzz build
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
bin_dir=${CARGO_TARGET_DIR:-target}/$host/release

work=$(mktemp -d -t svnic-fuzz-ci.XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=()
summaries=()
for target in $(cargo +nightly fuzz list); do
    corpus=$work/corpus/$target artifacts=$work/artifacts/$target/ log=$work/$target.log
    # TMPDIR: what a crashed target leaves in the temporary directory goes with $work.
    mkdir -p "$corpus" "$artifacts" "$work/tmp"
    if compgen -G "corpus/$target/seed-*" >/dev/null; then
        cp corpus/"$target"/seed-* "$corpus"/
    fi
    echo "== fuzzing $target for ${seconds} s"
    start=$(date +%s)
    status=0
    # -timeout: one input of the engine and vhost-user targets takes milliseconds, but a
    # panic's backtrace symbolisation on a loaded machine takes seconds (fuzz/README.md).
    TMPDIR=$work/tmp "$bin_dir/$target" -max_total_time="$seconds" -timeout=30 -print_final_stats=1 \
        -artifact_prefix="$artifacts" "$corpus" >"$log" 2>&1 || status=$?
    elapsed=$(($(date +%s) - start))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    crashes=$(find "$artifacts" -type f | wc -l)
    if ((status != 0)) && ((crashes == 0)); then
        crashes=1 # died without writing an input (e.g. killed): still a failure
    fi
    summaries+=("fuzz: $target: ${runs:-0} runs, ${elapsed} s, ${crashes} crashes")
    echo "${summaries[-1]}"
    if ((crashes > 0)); then
        failed+=("$target")
        echo "---- $target: last lines of libFuzzer's output"
        grep -v '^    #[0-9]' "$log" | tail -n 40
        for f in "$artifacts"*; do
            [ -f "$f" ] || continue
            echo "---- $target: $(basename "$f") (base64; decode into a file and pass it to" \
                "the target to reproduce)"
            base64 -w 0 "$f"
            echo
        done
    fi
done

echo "== fuzzing summary"
printf '%s\n' "${summaries[@]}"
if ((${#failed[@]})); then
    echo "fuzz-ci: FAILED: ${failed[*]}" >&2
    exit 1
fi
