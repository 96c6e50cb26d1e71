"""Stdlib bug-fix tasks, SWE-smith style: one AST mutation of an installed pure-Python stdlib
module per task, validated against the module's own unittest suite.

Tasks are data (module, mutation, test ids, statement): `materialize` rebuilds a task's
repository from this machine's installation and refuses, naming the task, if that source is
not the one the task was built from. Rebuild the suite with scripts/build_stdlib_tasks.py.
"""

from envs.stdlib.materialize import materialize, reference_edit, reference_fix, verify
from envs.stdlib.mutations import Mutation, MutationError
from envs.stdlib.rows import Row, TaskRowError
from envs.stdlib.suite import BUILTIN, load_rows
from envs.stdlib.testing import TestSummary, parse_details, parse_summary, test_command

__all__ = ["BUILTIN", "Mutation", "MutationError", "Row", "TaskRowError", "TestSummary",
           "load_rows", "materialize", "parse_details", "parse_summary", "reference_edit",
           "reference_fix", "test_command", "verify"]
