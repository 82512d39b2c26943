#!/usr/bin/env python3
"""Drives the REPL of a catalog in a pseudo-terminal after a statement that fails after its
admission (round 49, review composition F4): the receipt follows the fixed message, the prompt
moves to the failed statement's tables, and one file under two names shows each name's budget.
Used by dpfusion-cli/tests/it/receipts.rs (`r49_the_repl_prompt_follows_a_failed_statement_and_every_name`).

usage: failed_receipt_session.py BINARY DIR (DIR holds the catalog c.toml)
Exits 0 on success; on failure prints the transcript and the failed expectation, exits 1.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pty_session import Session  # noqa: E402

BIN, DIR = sys.argv[1], sys.argv[2]
s = Session([BIN, "--catalog", "c.toml"], env={"DPFUSION_HISTORY": os.path.join(DIR, "history")},
            cwd=DIR)
read_until, send = s.read_until, s.send
read_until(r"dpfusion> \s*$")
send("SELECT dp_count(age, epsilon => 0.1) AS n FROM b;\r")
read_until(r"charged b: [\s\S]*dpfusion\[b [\d.]+% left, ε ≤ [\d.]+\]> \s*$")
send("SELECT id, dp_count(age, epsilon => 0.3) AS n FROM a2 GROUP BY id;\r")
out = read_until(r"charged a2: [\s\S]*dpfusion\[a2 [\d.]+% left, ε ≤ [\d.]+[^\n]*\]> \s*$")
assert re.search(r"ERROR in: SELECT id[\s\S]*the query failed while it ran[\s\S]*charged a2: dp_count\(ε 0\.3", out), out
send("SELECT dp_count(age, epsilon => 0.1) AS n FROM a;\r")
out = read_until(r"charged a: [\s\S]*dpfusion\[a [\d.]+% left, ε ≤ [\d.]+[^\n]*\]> \s*$")
assert "charged a2" not in out, out
send("\\d\r")
out = read_until(r"Tables:[\s\S]*\\d TABLE[\s\S]*\]> \s*$")
line = next(l for l in out.splitlines() if l.strip().startswith("a "))
assert "private, budget ε 3 at δ 1e-6 (one budget with a2: the same file)" in line, line
send("\\q\r")
s.finish()
