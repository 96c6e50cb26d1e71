"""Mutation operators: AST visitors that propose one-token (or one-span) bugs.

Only code inside function bodies is mutated: bugs there break behaviour that tests observe,
while module-level edits mostly break the import and every test at once. Each operator maps a
node to zero or more (op, start, end, original, replacement) edits on the exact source text.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterator

from envs.stdlib.mutations import Mutation

FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
COMPARE = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
           ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: ("is", "is not"),
           ast.IsNot: ("is not", "is"), ast.In: ("in", "not in"), ast.NotIn: ("not in", "in")}
BINOP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"),
         ast.FloorDiv: ("//", "*"), ast.Div: ("/", "//"), ast.LShift: ("<<", ">>"),
         ast.RShift: (">>", "<<"), ast.BitAnd: ("&", "|"), ast.BitOr: ("|", "&")}
BOOLOP = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
CALLS = {"min": "max", "max": "min", "any": "all", "all": "any", "startswith": "endswith",
         "endswith": "startswith", "lstrip": "rstrip", "rstrip": "lstrip", "upper": "lower",
         "lower": "upper", "find": "rfind", "rfind": "find", "index": "rindex",
         "rindex": "index", "ljust": "rjust", "rjust": "ljust", "floor": "ceil", "ceil": "floor"}
ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)
DROPPABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Raise,
             ast.Delete, ast.Break, ast.Continue)

Edit = tuple[str, tuple[int, int], tuple[int, int], str, str]


class Source:
    """Source text with conversions from AST positions (UTF-8 byte columns) to characters."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.split("\n")
        self.starts = [0]
        for line in self.lines[:-1]:
            self.starts.append(self.starts[-1] + len(line) + 1)

    def char_col(self, lineno: int, byte_col: int) -> int:
        line = self.lines[lineno - 1]
        return byte_col if line.isascii() else len(line.encode()[:byte_col].decode())

    def begin(self, node: ast.AST) -> int:
        return self.starts[node.lineno - 1] + self.char_col(node.lineno, node.col_offset)

    def finish(self, node: ast.AST) -> int:
        line = node.end_lineno
        return self.starts[line - 1] + self.char_col(line, node.end_col_offset)

    def pos(self, index: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.starts, index)
        return (line, index - self.starts[line - 1])

    def edit(self, op: str, lo: int, hi: int, replacement: str) -> Edit:
        return (op, self.pos(lo), self.pos(hi), self.text[lo:hi], replacement)

    def token_between(self, left: ast.AST, right: ast.AST, token: str) -> tuple[int, int] | None:
        """Span of the operator `token` between two operands, if nothing else is there."""
        lo, hi = self.finish(left), self.begin(right)
        pattern = r"[\s)\\]*(" + r"\s+".join(map(re.escape, token.split())) + r")[\s(\\]*"
        match = re.fullmatch(pattern, self.text[lo:hi])
        return (lo + match.start(1), lo + match.end(1)) if match else None


def flip_comparison(node: ast.AST, src: Source) -> Iterator[Edit]:
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:], strict=False):
            token, new = COMPARE[type(op)]
            span = src.token_between(left, right, token)
            if span:
                yield src.edit("flip_comparison", *span, new)


def swap_operator(node: ast.AST, src: Source) -> Iterator[Edit]:
    if isinstance(node, ast.BinOp) and type(node.op) in BINOP:
        left, right, suffix = node.left, node.right, ""
    elif isinstance(node, ast.AugAssign) and type(node.op) in BINOP:
        left, right, suffix = node.target, node.value, "="
    else:
        return
    token, new = BINOP[type(node.op)]
    span = src.token_between(left, right, token + suffix)
    if span:
        yield src.edit("swap_operator", *span, new + suffix)


def swap_boolean(node: ast.AST, src: Source) -> Iterator[Edit]:
    if isinstance(node, ast.BoolOp) and len(node.values) == 2:
        token, new = BOOLOP[type(node.op)]
        span = src.token_between(node.values[0], node.values[1], token)
        if span:
            yield src.edit("swap_boolean", *span, new)


def _int_literal(node: ast.AST, src: Source) -> bool:
    return (isinstance(node, ast.Constant) and type(node.value) is int
            and src.text[src.begin(node):src.finish(node)] == str(node.value))


def _index_like(node: ast.AST, parent: ast.AST | None) -> bool:
    """Where an integer is a position, bound or count: the home of off-by-one bugs."""
    if isinstance(parent, ast.Slice | ast.Compare):
        return True
    if isinstance(parent, ast.Subscript):
        return parent.slice is node
    if isinstance(parent, ast.BinOp):
        return isinstance(parent.op, ast.Add | ast.Sub)
    return (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name)
            and parent.func.id == "range" and node in parent.args)


def off_by_one(node: ast.AST, src: Source, parent: ast.AST | None) -> Iterator[Edit]:
    if _int_literal(node, src) and _index_like(node, parent):
        lo, hi = src.begin(node), src.finish(node)
        yield src.edit("off_by_one", lo, hi, str(node.value + 1))
        if node.value > 0:
            yield src.edit("off_by_one", lo, hi, str(node.value - 1))


def wrong_constant(node: ast.AST, src: Source, parent: ast.AST | None) -> Iterator[Edit]:
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        yield src.edit("wrong_constant", src.begin(node), src.finish(node), str(not node.value))
    elif _int_literal(node, src) and not _index_like(node, parent):
        yield src.edit("wrong_constant", src.begin(node), src.finish(node), str(node.value + 1))


def swap_arguments(node: ast.AST, src: Source) -> Iterator[Edit]:
    if not isinstance(node, ast.Call):
        return
    for left, right in zip(node.args, node.args[1:], strict=False):
        if isinstance(left, ast.Starred) or isinstance(right, ast.Starred):
            continue
        a_lo, a_hi = src.begin(left), src.finish(left)
        b_lo, b_hi = src.begin(right), src.finish(right)
        a, gap, b = src.text[a_lo:a_hi], src.text[a_hi:b_lo], src.text[b_lo:b_hi]
        if a != b and re.fullmatch(r"\s*,\s*", gap):
            yield src.edit("swap_arguments", a_lo, b_hi, b + gap + a)


def invert_condition(node: ast.AST, src: Source) -> Iterator[Edit]:
    if not isinstance(node, ast.If | ast.While | ast.IfExp):
        return
    test = node.test
    lo, hi = src.begin(test), src.finish(test)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        new = re.sub(r"^not\s*", "", src.text[lo:hi])  # keeps the operand's own parentheses
    elif isinstance(test, ATOMS):
        new = "not " + src.text[lo:hi]
    else:
        new = "not (" + src.text[lo:hi] + ")"
    yield src.edit("invert_condition", lo, hi, new)


def swap_function(node: ast.AST, src: Source) -> Iterator[Edit]:
    if not isinstance(node, ast.Call):
        return
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name not in CALLS:
        return
    hi = src.finish(func)
    lo = hi - len(name)
    if src.text[lo:hi] == name:
        yield src.edit("swap_function", lo, hi, CALLS[name])


def drop_statement(node: ast.AST, src: Source) -> Iterator[Edit]:
    """Delete a simple statement's whole lines from a block that keeps another statement."""
    for field in ("body", "orelse", "finalbody"):
        block = getattr(node, field, None)
        if not isinstance(block, list) or len(block) < 2:
            continue
        for stmt in block:
            if not isinstance(stmt, DROPPABLE) or _is_docstring(stmt):
                continue
            lo, hi = src.begin(stmt), src.finish(stmt)
            line_lo = src.starts[stmt.lineno - 1]
            if stmt.end_lineno >= len(src.lines):
                continue
            line_hi = src.starts[stmt.end_lineno]
            if src.text[line_lo:lo].strip() or not re.fullmatch(r"\s*(#.*)?\n",
                                                                src.text[hi:line_hi]):
                continue
            yield src.edit("drop_statement", line_lo, line_hi, "")


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


PLAIN = (flip_comparison, swap_operator, swap_boolean, swap_arguments, invert_condition,
         swap_function, drop_statement)
CONTEXTUAL = (off_by_one, wrong_constant)
OPERATORS = sorted(f.__name__ for f in PLAIN + CONTEXTUAL)


def _scoped(node: ast.AST, parent: ast.AST | None, inside: bool
            ) -> Iterator[tuple[ast.AST, ast.AST | None]]:
    """(node, parent) for function definitions and everything in their bodies, each once."""
    is_def = isinstance(node, FUNCS)
    if inside or is_def:
        yield node, parent
    children = node.body if is_def else ast.iter_child_nodes(node)
    for child in children:
        yield from _scoped(child, node, inside or is_def)


def find_mutations(text: str) -> list[Mutation]:
    """Every mutation the operators propose for `text`, in source order (no duplicates)."""
    src = Source(text)
    edits: set[Edit] = set()
    for node, parent in _scoped(ast.parse(text), None, False):
        for plain in PLAIN:
            edits.update(plain(node, src))
        for contextual in CONTEXTUAL:
            edits.update(contextual(node, src, parent))
    return [Mutation(op, start, end, original, replacement)
            for op, start, end, original, replacement in sorted(edits, key=_order)]


def _order(edit: Edit) -> tuple:
    op, start, end, original, replacement = edit
    return (start, end, op, replacement)
