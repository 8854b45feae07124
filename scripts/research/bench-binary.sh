#!/usr/bin/env bash
# Builds the engine bench (backend/benches/engine.rs) without running it and prints the path of
# its binary; any arguments are passed to cargo (e.g. --features dma-timing, or --manifest-path of
# another checkout). Used by dma-instructions.sh, dma-phases.sh and dma-ab.sh (beside it).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo bench -p svnic-backend --bench engine --no-run --message-format=json "$@" |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "engine" and m.get("executable"):
        print(m["executable"])' | tail -1
