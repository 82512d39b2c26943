#!/usr/bin/env python3
"""Drives `dpfusion --connect` (the REPL as a client of `dpfusion serve`) in a pseudo-terminal.
Used by dpfusion-cli/tests/it/serve.rs (`the_repl_connects_to_a_server_in_a_pseudo_terminal`).

usage: remote_session.py BINARY URL TOKEN_FILE HISTORY
Exits 0 on success; on failure prints the transcript and the failed expectation, exits 1.
"""
import os
import re
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pty_session import Session  # noqa: E402

# Bounded: a client that hangs fails the test instead of holding it up.
signal.alarm(120)

BIN, URL, TOKEN_FILE, HISTORY = sys.argv[1:5]
s = Session([BIN, "--connect", URL, "--token-file", TOKEN_FILE], env={"DPFUSION_HISTORY": HISTORY})
read_until, send = s.read_until, s.send


# The banner names the server and lists its tables with their budgets.
out = read_until(r"connected to[\s\S]*people[\s\S]*dpfusion> \s*$")
assert "private, budget" in out, out
# A DP query: its result, the receipt, and the prompt with the remaining budget.
send("SELECT dp_count(id, 0.25) AS n FROM people;\r")
out = read_until(r"charged people[\s\S]*dpfusion\[people \d+(\.\d+)?% left, ε ≤ [\d.]+\]> \s*$")
assert re.search(r"\|\s*n\s*\|", out), out
# A refusal: the server's message.
send("SELECT age FROM people;\r")
out = read_until(r"ERROR[\s\S]*dpfusion\[people")
assert "refused" in out, out
# Partition selection spends δ: the prompt shows what is left of it, as the local one does (one
# REPL over both backends).
send("SELECT dept, dp_count(id, 0.25) AS n FROM people GROUP BY dept;\r")
out = read_until(r"charged people[\s\S]*dpfusion\[people [^\n]*ε ≤ [\d.]+ δ [^\s\]]+ left\]> \s*$")
# Meta-commands.
send("\\budget\r")
out = read_until(r"remaining_epsilon[\s\S]*dpfusion\[people[^\n]*\]> \s*$")
send("\\d people\r")
out = read_until(r"Table people[\s\S]*dpfusion\[people[^\n]*\]> \s*$")
assert "age" in out and "Int64" in out, out
# Completion of the server's column names.
send("SELECT dp_count(sala\t")
out = read_until(r"salary")
send("\x03")
read_until(r"\^C")
send("\\q\r")
s.finish()
