"""Which stdlib modules make tasks, and why the others do not.

A module qualifies when it is one pure-Python file with a fast, self-contained suite
`test.test_<name>`, and when a copy in the task's repository really is what its tests import.
That fails for modules the interpreter imports at start-up (the stdlib copy is already loaded)
and would be unsafe for the test harness's own imports, except the few in HARNESS_SAFE.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

MODULES = (
    "base64", "bisect", "bz2", "calendar", "codeop", "colorsys", "configparser", "copy",
    "csv", "dataclasses", "difflib", "filecmp", "fileinput", "fractions", "getopt", "gettext",
    "glob", "graphlib", "gzip", "heapq", "lzma", "mailbox", "mimetypes", "modulefinder",
    "netrc", "optparse", "pickletools", "plistlib", "pprint", "pstats", "quopri",
    "rlcompleter", "secrets", "shelve", "shlex", "shutil", "statistics", "string",
    "tempfile", "textwrap", "timeit", "uuid", "wave", "zipapp",
)

# Imported by `import unittest, traceback`, so unittest runs on the repository's copy too; but
# unittest only formats failure messages (or parses its command line) with them, so a mutant
# there can change a failure's message, never whether a test passes.
HARNESS_SAFE = frozenset({"copy", "dataclasses", "difflib", "gettext", "heapq", "pprint",
                             "textwrap"})

# Not used, and why (measured on Python 3.11.7):
# argparse: 1,700 tests, so every task would carry a ~75 kB PASS_TO_PASS list.
# cmd: 2 tests runnable by id, and none of 40 mutants broke them.
# aifc asynchat asyncore cgi cgitb crypt imghdr imp mailcap nntplib pipes smtpd sndhdr sunau
#   telnetlib uu xdrlib: deprecated by PEP 594, gone in Python 3.13.
# ast dis inspect linecache tokenize traceback weakref: the test harness itself runs on them.
# ftplib imaplib poplib smtplib socket socketserver ssl selectors: network servers.
# bdb getpass pdb pty queue signal subprocess threading tty webbrowser: processes, threads,
#   terminals.
# sched: most mutants hang its scheduler loop; 280 s of build time for 6 tasks.
# compileall datetime decimal pickle pydoc tarfile trace zipfile: suites over 4 s.
# hashlib hmac locale struct symtable: thin wrappers over C code.
# platform sysconfig tabnanny: their suites fail here even unmutated (machine-dependent).


def _imported_by(python: str, code: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                         env=env)
    return set(ast.literal_eval(out.stdout))


def shadow_blockers(python: str = sys.executable) -> dict[str, str]:
    """Modules a repository copy cannot shadow under `python`, with the reason."""
    at_start = _imported_by(python, "import sys; print(sorted(sys.modules))")
    harness = _imported_by(python, "import sys; s = set(sys.modules); "
                           "import unittest, traceback; print(sorted(set(sys.modules) - s))")
    blockers = {m: "imported by the test harness" for m in harness - HARNESS_SAFE}
    blockers.update({m: "imported at interpreter start" for m in at_start})
    return blockers
