#!/usr/bin/env python3
"""Fails if the modules of any workspace crate import each other in a cycle.

Rule: within a crate, sibling modules (children of the same parent) must form an acyclic
graph, where module A depends on sibling B when any file of A's subtree names a path into
B's subtree (`crate::...`, `super::...`, `self::...`, in `use` or inline). A module may use
the items of its ancestors; those edges are not counted. Cycles are reported as
`crate: a -> b -> a`.

Usage: scripts/check-module-cycles.py [CRATE_DIR...]   (default: every crate of the workspace)
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
PATH_RE = re.compile(r"\b(crate|super|self)((?:::" + IDENT + r")+)")
USE_RE = re.compile(r"\buse\s+([^;]+);", re.S)
MOD_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", re.M)
COMMENT_RE = re.compile(r"//[^\n]*")


def crate_dirs(root):
    """Directories of the workspace's packages (those with a Cargo.toml and a src/)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("target", ".git", "fuzz", "vm-images")]
        if "Cargo.toml" in filenames and os.path.isdir(os.path.join(dirpath, "src")):
            found.append(dirpath)
    return sorted(found)


def module_files(src):
    """Map of module path (tuple) -> file, following `mod x;` from each crate root."""
    mods = {}
    roots = [f for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, f))]
    bin_dir = os.path.join(src, "bin")
    bins = []
    if os.path.isdir(bin_dir):
        bins = [os.path.join("bin", f) for f in os.listdir(bin_dir) if f.endswith(".rs")]

    def walk(path, file, dir_for_children):
        mods[path] = file
        text = COMMENT_RE.sub("", open(file, encoding="utf-8").read())
        for name in MOD_RE.findall(text):
            for cand in (
                os.path.join(dir_for_children, name + ".rs"),
                os.path.join(dir_for_children, name, "mod.rs"),
            ):
                if os.path.exists(cand):
                    child_dir = (
                        os.path.join(dir_for_children, name)
                        if cand.endswith(name + ".rs")
                        else os.path.dirname(cand)
                    )
                    walk(path + (name,), cand, child_dir)
                    break

    graphs = []
    for r in roots + bins:
        mods = {}
        walk((), os.path.join(src, r), src)
        graphs.append((r, mods))
    return graphs


def expand_use(tree):
    """Expands a use tree (`a::{b, c::{d}}`) into its paths, as lists of segments."""
    tree = re.sub(r"\s+", "", tree)
    out = []

    def rec(prefix, t):
        if "{" not in t:
            seg = [s for s in t.split("::") if s]
            out.append(prefix + seg)
            return
        i = t.index("{")
        head = [s for s in t[:i].split("::") if s]
        body = t[i + 1 : t.rindex("}")]
        depth, start = 0, 0
        parts = []
        for j, ch in enumerate(body):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(body[start:j])
                start = j + 1
        parts.append(body[start:])
        for p in parts:
            if p:
                rec(prefix + head, p)

    rec([], tree)
    return out


def resolve(segments, here, mods):
    """Module path a `crate/super/self::...` path names (its longest module prefix)."""
    if not segments:
        return None
    base = list(here)
    i = 0
    if segments[0] == "crate":
        base, i = [], 1
    elif segments[0] in ("super", "self"):
        while i < len(segments) and segments[i] in ("super", "self"):
            if segments[i] == "super":
                if not base:
                    return None
                base.pop()
            i += 1
    else:
        return None
    path = tuple(base)
    for seg in segments[i:]:
        if path + (seg,) in mods:
            path = path + (seg,)
        else:
            break
    return path


def cycles_of(mods):
    edges = {}
    for here, file in mods.items():
        text = COMMENT_RE.sub("", open(file, encoding="utf-8").read())
        paths = []
        for m in USE_RE.finditer(text):
            paths += expand_use(m.group(1))
        for m in PATH_RE.finditer(text):
            paths.append([m.group(1)] + [s for s in m.group(2).split("::") if s])
        for segs in paths:
            target = resolve(segs, here, mods)
            if target is None:
                continue
            # Lowest common ancestor; the edge is between its two children on each side.
            k = 0
            while k < min(len(here), len(target)) and here[k] == target[k]:
                k += 1
            if k == len(here) or k == len(target):
                continue  # an ancestor's items, or a descendant's
            parent = here[:k]
            a, b = here[k], target[k]
            edges.setdefault(parent, {}).setdefault(a, set()).add(b)
    found = []
    for parent, g in edges.items():
        state = {}
        stack = []

        def dfs(n):
            state[n] = 1
            stack.append(n)
            for m in sorted(g.get(n, ())):
                if state.get(m) == 1:
                    cyc = stack[stack.index(m) :] + [m]
                    found.append("::".join(parent) + ": " + " -> ".join(cyc))
                elif m not in state:
                    dfs(m)
            stack.pop()
            state[n] = 2

        for n in sorted(g):
            if n not in state:
                dfs(n)
    return found


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = sys.argv[1:] or crate_dirs(root)
    bad = 0
    for d in dirs:
        for entry, mods in module_files(os.path.join(d, "src")):
            for c in cycles_of(mods):
                print(f"{os.path.relpath(d, root)} ({entry}): cycle {c}")
                bad += 1
    if bad:
        print(f"{bad} module cycle(s)")
        return 1
    print(f"no module cycles in {len(dirs)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
