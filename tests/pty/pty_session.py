"""The pseudo-terminal session the scripts in tests/pty share: runs a binary in a pseudo-terminal
(Python's standard `pty` module), reads what the screen shows until a pattern, types, and checks
how it exits. On a failed expectation it prints the transcript and exits 1.
"""
import os
import pty
import re
import select
import sys
import time

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Session:
    def __init__(self, argv, env=None, cwd=None):
        pid, fd = pty.fork()
        if pid == 0:
            if cwd:
                os.chdir(cwd)
            full = dict(os.environ, TERM="xterm", COLUMNS="200", LINES="50")
            full.update(env or {})
            os.execve(argv[0], argv, full)
        self.pid, self.fd, self.transcript = pid, fd, ""

    def read_until(self, pattern, timeout=120):
        """Reads the terminal until `pattern` (regex) appears in the text read since the last
        call; returns that text without its escape sequences."""
        seen = ""
        deadline = time.time() + timeout
        while time.time() < deadline:
            r, _, _ = select.select([self.fd], [], [], 0.2)
            if self.fd in r:
                try:
                    data = os.read(self.fd, 65536).decode("utf-8", "replace")
                except OSError:
                    break
                seen += data
                self.transcript += data
                if re.search(pattern, ANSI.sub("", seen)):
                    return ANSI.sub("", seen)
        print("---- transcript ----\n" + ANSI.sub("", self.transcript))
        print(f"---- expected /{pattern}/ within {timeout}s, got since last step:\n"
              + ANSI.sub("", seen))
        print("---- its end: " + repr(seen[-120:]))
        sys.exit(1)

    def send(self, text):
        os.write(self.fd, text.encode())

    def finish(self):
        """Waits for the program to exit: 0, or the transcript is printed and this exits 1."""
        _, status = os.waitpid(self.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            print("---- transcript ----\n" + ANSI.sub("", self.transcript))
            print("exit status", status)
            sys.exit(1)
        print("ok")
