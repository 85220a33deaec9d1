#!/usr/bin/env python3
"""Check recipes/vllm.yaml's change table by commit ancestry in a vllm-project/vllm clone.

    python scripts/check_build_ancestry.py /path/to/vllm [--recipes recipes] [--ref main]

For each change (vllm#NNNNN) the merge commit is found on --ref by its squash-merge title, which ends in
"(#NNNNN)"; for each build with a commit, `git merge-base --is-ancestor <merge> <build commit>` decides whether
the build contains it. Prints one line per (build, change): the ancestry answer, what the table records and
how, and MISMATCH where they disagree. Exit status 1 on any mismatch, 2 on bad usage. It writes nothing:
copy an answer into recipes/vllm.yaml as {in: ..., how: ancestry, source: "<merge> is (not) an ancestor of
<build commit>"} by hand, after reading it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def merge_commit(repo: Path, ref: str, change: str) -> str | None:
    number = change.split("#", 1)[1]
    r = git(repo, "log", "--format=%H", "--fixed-strings", f"--grep=(#{number})", ref)
    lines = r.stdout.split()
    return lines[-1] if r.returncode == 0 and lines else None  # the oldest: a revert names the PR too


def contains(repo: Path, merge: str, commit: str) -> bool | None:
    r = git(repo, "merge-base", "--is-ancestor", merge, commit)
    return {0: True, 1: False}.get(r.returncode)  # anything else: the commit is not in this clone


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("repo", type=Path, help="a clone of vllm-project/vllm with the builds' commits")
    p.add_argument("--recipes", type=Path, default=Path(__file__).resolve().parent.parent / "recipes")
    p.add_argument("--ref", default="main", help="where the squash merges are (default: main)")
    a = p.parse_args(argv)
    if git(a.repo, "rev-parse", "--git-dir").returncode != 0:
        print(f"check_build_ancestry: {a.repo} is not a git repository", file=sys.stderr)
        return 2
    data = yaml.safe_load((a.recipes / "vllm.yaml").read_text())
    merges = {c: merge_commit(a.repo, a.ref, c) for c in data["changes"]}
    mismatches = 0
    for name, b in data["builds"].items():
        commit = b.get("commit")
        if not commit:
            print(f"{name}: no commit recorded; nothing to check")
            continue
        full = git(a.repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").stdout.strip()
        if not full:
            print(f"{name}: commit {commit} is not in this clone; fetch it first")
            continue
        for change, merge in merges.items():
            fact = (b.get("changes") or {}).get(change) or {"in": None}
            recorded = f"table: {fact.get('in')}" + (f" ({fact['how']})" if fact.get("how") else "")
            if merge is None:
                print(f"{name} {change}: no merge commit titled (#{change.split('#')[1]}) on {a.ref}; {recorded}")
                continue
            answer = contains(a.repo, merge, full)
            flag = ""
            if fact.get("in") is not None and answer is not None and answer != fact["in"]:
                flag, mismatches = "  MISMATCH", mismatches + 1
            print(f"{name} {change}: merge {merge[:12]} {'is' if answer else 'is not'} an ancestor of {full[:12]}; "
                  f"{recorded}{flag}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
