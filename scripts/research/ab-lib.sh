# Shared by the A/B scripts (demo-ab.sh, dma-ab.sh); source it after `cd` to the repository root.

# ab_rounds NAME ROUNDS: exits with a message unless ROUNDS is a positive number.
ab_rounds() {
    [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "$1: ROUNDS must be a positive number, not '$2'" >&2; exit 2; }
}

# ab_setup: sets repo (this folder) and work (a temporary folder, removed with its worktrees on
# exit), and builds both revisions in target/ab: a directory of their own, never the repository's
# target/. Cargo names a workspace crate's artifacts by its path inside the workspace, so a
# worktree's build in target/ would replace the repository's with another revision's, and the
# repository's older sources would then look up to date against it.
ab_setup() {
    repo=$(pwd)
    work=$(mktemp -d)
    trap ab_cleanup EXIT
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target/ab}
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
