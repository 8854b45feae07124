# Shared by the A/B scripts (demo-ab.sh, dma-ab.sh); source it after `cd` to the repository root.

# ab_rounds NAME ROUNDS: exits with a message unless ROUNDS is a positive number.
ab_rounds() {
    [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "$1: ROUNDS must be a positive number, not '$2'" >&2; exit 2; }
}

# ab_setup: sets repo (this folder) and work (a temporary folder, removed with its worktrees on
# exit) and makes every build share the repository's target directory.
ab_setup() {
    repo=$(pwd)
    work=$(mktemp -d)
    trap ab_cleanup EXIT
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}
}

ab_cleanup() {
    for x in a b; do
        [ -d "$work/$x" ] && git -C "$repo" worktree remove --force "$work/$x" 2>/dev/null || true
    done
    rm -rf "$work"
}

# ab_worktree X REV: checks REV out (detached) in $work/X and names it.
ab_worktree() {
    git worktree add --quiet --detach "$work/$1" "$2"
    echo "$1 = $2 ($(git rev-parse --short "$2"))"
}
