# Sourced by scripts/bench-*.sh right after `set -euo pipefail`: what every bench script shares.
# Sourcing it makes the repository the working folder and defines
#   root                      the repository's top folder
#   target                    cargo's target folder ($CARGO_TARGET_DIR, else $root/target)
#   build=1                   what --no-build turns off: build the release binaries first
#   bench_args ARG...         parses --rounds N (into `rounds`, whose default the calling script
#                             sets), --no-build and -h/--help (prints the calling script's header,
#                             from its second line to the line before `set -euo`, and exits 0);
#                             any other argument goes to the script's own `bench_option` function
#                             if it has one; an argument neither knows fails with exit status 64.
#   bench_value VAR OPT VAL   sets VAR to VAL, the value of option OPT, and `bench_took` to 2;
#                             fails with exit status 64 if there is no VAL.
# bench_option ARG... is called with the arguments not parsed yet; it handles the first one and
# sets `bench_took` to how many it used (1 for a flag, 2 for an option and its value), or returns
# non-zero if the first one is not one of the script's options.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# The calling script, by a path that still holds after the cd below (for --help).
bench_script=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
build=1

bench_args() {
    while [ $# -gt 0 ]; do
        bench_took=0
        case "$1" in
            --rounds) bench_value rounds "$@" ;;
            --no-build) build=0; bench_took=1 ;;
            -h|--help)
                sed -n '2,/^set -euo/p' "$bench_script" | sed '$d'
                exit 0
                ;;
            *)
                if ! declare -F bench_option >/dev/null || ! bench_option "$@" \
                    || [ "$bench_took" -lt 1 ]; then
                    echo "unknown argument: $1 (try --help)" >&2
                    exit 64
                fi
                ;;
        esac
        shift "$bench_took"
    done
}

bench_value() {
    if [ $# -lt 3 ]; then
        echo "$2 needs a value (try --help)" >&2
        exit 64
    fi
    printf -v "$1" '%s' "$3"
    bench_took=2
}
