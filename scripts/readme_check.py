#!/usr/bin/env python3
"""Runs the README's runnable shell blocks, as a new user would, and checks (or re-records) the
outputs the README prints. Standard library only.

A block runs when the line before its ```sh fence is `<!-- readme-check -->`. Every runnable block
runs in order, in one bash process (so a server started in the background by one block serves the
next), with `set -euo pipefail`, from a scratch copy of the repository's examples/ and sql/ (so the
example ledgers start fresh and the repository is never written), with `dpfusion` on the PATH
being the binary given by --bin (default: the dev build, target/debug/dpfusion).

A ```text block marked `<!-- readme-check: output -->` right after a runnable block holds that
block's standard output. DP releases draw fresh noise every run, so the check compares outputs
with every number masked (and table rules and spacing ignored); --record writes the new outputs,
numbers included, into README.md.

usage: scripts/readme_check.py [--bin PATH] [--readme README.md] [--record] [--keep] [-v]
Exit status 0 when every block ran and every output matched; 1 otherwise (what failed is printed).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

RUN = "<!-- readme-check -->"
OUTPUT = "<!-- readme-check: output -->"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def blocks(lines):
    """The runnable blocks: (index, code, output span or None), where the span is the line range
    of the marked output block's body."""
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == RUN and i + 1 < len(lines) and lines[i + 1].startswith("```sh"):
            j = i + 2
            while not lines[j].startswith("```"):
                j += 1
            code = "".join(lines[i + 2 : j])
            span = None
            k = j + 1
            if k + 1 < len(lines) and lines[k].strip() == OUTPUT and lines[k + 1].startswith("```"):
                m = k + 2
                while not lines[m].startswith("```"):
                    m += 1
                span = (k + 2, m)
            found.append((len(found), code, span))
            i = j + 1
        else:
            i += 1
    return found


def masked(text):
    """Output with numbers masked, table rules and spacing dropped: what the check compares."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?", "N", line)
        line = re.sub(r"[-+|]{2,}|\s+", " ", line).strip()
        if line:
            out.append(line)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "debug", "dpfusion"))
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--record", action="store_true", help="write the new outputs into the README")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every block's output")
    a = ap.parse_args()
    binary = os.path.abspath(a.bin)
    if not os.access(binary, os.X_OK):
        sys.exit(f"readme_check: no dpfusion binary at {binary} (build it, or give --bin)")
    with open(a.readme, encoding="utf-8") as f:
        lines = f.readlines()
    found = blocks(lines)
    if not found:
        sys.exit("readme_check: no runnable block (marked with " + RUN + ")")

    work = tempfile.mkdtemp(prefix="readme-check-")
    try:
        ignore = shutil.ignore_patterns(".dpfusion", "*.witness", "out", "serve.toml")
        for d in ("examples", "sql"):
            shutil.copytree(os.path.join(ROOT, d), os.path.join(work, d), ignore=ignore)
        os.makedirs(os.path.join(work, "examples", "catalog", "out"), exist_ok=True)
        bindir = os.path.join(work, ".bin")
        os.makedirs(bindir)
        os.symlink(binary, os.path.join(bindir, "dpfusion"))
        # One script: each block's output between markers; background jobs killed at the end.
        script = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
        for n, code, _ in found:
            script.append(f"echo '@@readme-check block {n}@@'")
            script.append(code)
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
                   HOME=work, DPFUSION_HISTORY=os.path.join(work, "history"))
        p = subprocess.run(["bash", "-c", "\n".join(script)], cwd=work, env=env,
                           capture_output=True, text=True, timeout=600)
        outs = {}
        cur = None
        for line in p.stdout.splitlines(keepends=True):
            m = re.match(r"@@readme-check block (\d+)@@", line)
            if m:
                cur = int(m.group(1))
                outs[cur] = ""
            elif cur is not None:
                outs[cur] += line
        if a.verbose:
            for n, code, _ in found:
                print(f"--- block {n} ---\n{code}--- its output ---\n{outs.get(n, '')}")
            print(f"--- stderr ---\n{p.stderr}")
        failed = []
        if p.returncode != 0:
            last = max(outs) if outs else 0
            failed.append(f"block {last} failed (exit {p.returncode}):\n{found[last][1]}"
                          f"--- stdout ---\n{outs.get(last, '')}--- stderr ---\n{p.stderr}")
        replacements = []
        for n, code, span in found:
            if span is None or n not in outs:
                continue
            want = "".join(lines[span[0] : span[1]])
            got = outs[n]
            if a.record:
                replacements.append((span, got))
            elif masked(want) != masked(got):
                failed.append(f"block {n} printed something else than the README shows:\n{code}"
                              f"--- README ---\n{want}--- now ---\n{got}")
        if a.record and replacements and p.returncode == 0:
            for (s, e), got in sorted(replacements, reverse=True):
                lines[s:e] = [got if got.endswith("\n") else got + "\n"]
            with open(a.readme, "w", encoding="utf-8") as f:
                f.writelines(lines)
            print(f"readme_check: recorded {len(replacements)} output block(s) in {a.readme}")
        for f in failed:
            print("readme_check: " + f, file=sys.stderr)
        if not failed:
            print(f"readme_check: {len(found)} block(s) ran, "
                  f"{sum(1 for b in found if b[2])} output(s) matched")
        return 1 if failed else 0
    finally:
        if a.keep:
            print("readme_check: scratch directory kept: " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
