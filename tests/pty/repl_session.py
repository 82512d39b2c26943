#!/usr/bin/env python3
"""Drives the real `dpfusion` binary in a pseudo-terminal (Python's standard `pty` module) and
checks what the screen shows. Used by dpfusion-cli/tests/it/cli.rs (`repl_in_a_pseudo_terminal`).

usage: repl_session.py BINARY LEDGER HISTORY
Exits 0 on success; on failure prints the transcript and the failed expectation, exits 1.
"""
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pty_session import Session  # noqa: E402

BIN, LEDGER, HISTORY = sys.argv[1], sys.argv[2], sys.argv[3]
s = Session([BIN, "--ledger", LEDGER], env={"DPFUSION_HISTORY": HISTORY})
read_until, send = s.read_until, s.send

read_until(r"dpfusion> ")
# A multi-line query: the first line has no ';', so the REPL waits for more.
send("SELECT dp_count(salary, epsilon => 0.5)\r")
time.sleep(0.5)
send("  AS n FROM salaries;\r")
# The prompt shows the share of the budget left and the next query's largest ε (issue 29,
# docs/ACCOUNTING.md "What the numbers mean"): one small query uses about 1.4% of salaries'.
out = read_until(r"\| n[\s\S]*dpfusion\[salaries 98\.\d+% left, ε ≤ 4\.\d+\]> ")
assert re.search(r"\|\s*n\s*\|", out), out
# The budget.
send("\\budget\r")
out = read_until(r"remaining_delta[\s\S]*dpfusion\[salaries[^\n]*\]> \s*$")
assert "remaining_epsilon" in out and "salaries" in out and "patients" in out, out
# A refused query: raw rows of a private table.
send("SELECT * FROM salaries;\r")
out = read_until(r"ERROR[\s\S]*dpfusion\[salaries")
assert "ERROR" in out and "salaries" in out and "Traceback" not in out and "panicked" not in out, out
# Ctrl-C during input cancels the input, not the program.
send("SELECT dp_count(")
time.sleep(0.3)
send("\x03")
out = read_until(r"\^C")
send("\\d salaries\r")
out = read_until(r"neighbours: replace[\s\S]*dpfusion\[salaries[^\n]*\]> \s*$")
assert "job" in out and "(public)" in out, out
# Ctrl-C during a long model fit: back at the prompt within a second, and the charge stands.
# (Each step waits for the prompt at the end of the output: input typed before rustyline is
# back in raw mode may be discarded.)
PROMPT_AFTER_TABLE = r"remaining_delta[\s\S]*salaries[\s\S]*dpfusion\[salaries[^\n]*\]> \s*$"
send("\\budget\r")
before = read_until(PROMPT_AFTER_TABLE)
send("SELECT dp_linreg_gd(salary / 300000, [years / 40.0], epsilon => 0.5, iterations => 100000) FROM salaries;\r")
# Wait until the fit runs (its progress line shows), so that the query is admitted.
read_until(r"dp_linreg_gd: iteration \d+/100000", timeout=120)
sent = time.time()
send("\x03")
out = read_until(r"query cancelled[\s\S]*dpfusion\[salaries[^\n]*\]> \s*$", timeout=5)
# The cancelled fit was charged: its receipt is printed, as for a finished query.
assert re.search(r"query cancelled[\s\S]*charged salaries: dp_linreg_gd\(", out), out
took = time.time() - sent
assert took < 1.0, f"the prompt came back after {took:.2f} s"
send("\\budget\r")
after = read_until(PROMPT_AFTER_TABLE)
# The budget's numbers (a table or expanded records, depending on the terminal's width) change.
numbers = lambda text: re.findall(r"\d+\.\d+", text[text.find("table"):text.rfind("dpfusion[")])
assert numbers(before) != numbers(after), (before, after)
# A fit that ends (DP-AGD may stop before its last planned iteration): its progress line is
# erased before the result, so the table and the receipt never start on a progress line.
start = len(s.transcript)
send("SELECT dp_logreg_agd(disease, [age, bmi], epsilon => 0.3) AS m FROM patients;\r")
read_until(r"\+\s*\n[\s\S]*charged patients[\s\S]*dpfusion\[patients[^\n]*\]> \s*$", timeout=120)
raw = s.transcript[start:]
last = raw.rfind("iteration ")
table = raw.find("+", last if last >= 0 else 0)
assert last >= 0, "no progress was shown: " + repr(raw[:300])
assert "\r\x1b[2K" in raw[last:table], "the progress line was not erased: " + repr(raw[last:table + 40])
# \h NAME documents a function from the registry; \h alone lists them.
send("\\h dp_mean\r")
out = read_until(r"Arguments:[\s\S]*Example:[\s\S]*\]> \s*$")
assert "dp_mean(value, lower, upper, epsilon" in out and "neighbour mode" not in out, out
send("\\h\r")
out = read_until(r"DP aggregates[\s\S]*rgm_mean_by[\s\S]*\]> \s*$")
send("\\q\r")
s.finish()
