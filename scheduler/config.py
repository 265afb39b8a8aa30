"""Command-line options from config dataclasses: every field a flag, made one way (CleanRL's
habit: the settings live in one dataclass, and the command line can set each of them).

    add_options(parser, PPOConfig())   # --seed, --lr, --first-tau, --guide-prior A B, ...
    cfg = from_args(args, PPOConfig())  # those settings, with what the command line changed

A field `first_tau: float = 0.1  # the comment` becomes `--first-tau`, of the field's type, its
help the comment beside the field (or, lacking one, the comment above it) and the default the
one of the instance given. A field that is itself a config dataclass gives its own fields as
`--field.inner-name`. Types: bool (`--name` / `--no-name`), int, float, str, `Literal[...]`
(its choices), `tuple[T, ...]` (one value or more) and `tuple[T, T]` (that many values); any
other type is a TypeError when the options are made, so a new field cannot go without a flag.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import math
import textwrap
import tokenize
import typing
from typing import Any


def add_options(parser: argparse.ArgumentParser, base: Any, prefix: str = "") -> None:
    """A flag for every field of the config dataclass instance `base` (module doc), in an
    argument group named after its class. Flags not given leave no attribute on the parsed
    namespace: `from_args` takes `base`'s value for them."""
    cls = type(base)
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    group = parser.add_argument_group(
        f"{cls.__name__} (--{_flag(prefix)}...)" if prefix else cls.__name__
    )
    for f in dataclasses.fields(cls):
        value, name = getattr(base, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            add_options(parser, value, name + ".")
            continue
        shown = " ".join(map(str, value)) if isinstance(value, tuple) else str(value)
        text = comments.get(f.name, "")
        group.add_argument(
            "--" + _flag(name),
            dest=name,
            default=argparse.SUPPRESS,
            help=f"{text} (default: {shown})".lstrip().replace("%", "%%"),
            **_kind(hints[f.name], name),
        )


def add_resume_options(parser: argparse.ArgumentParser, resume_help: str, stop_help: str) -> None:
    """--resume and --stop-after-s: how every long training of the project runs in pieces (it
    saves its state, stops at its next episode or update after S seconds, and goes on)."""
    parser.add_argument("--resume", action="store_true", help=resume_help)
    parser.add_argument("--stop-after-s", type=float, default=math.inf, help=stop_help)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text}")
    return value


def from_args(args: argparse.Namespace, base: Any, prefix: str = "") -> Any:
    """`base` with the fields the command line set (`add_options` with the same `prefix`)."""
    changes = {}
    for f in dataclasses.fields(base):
        value, name = getattr(base, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            changes[f.name] = from_args(args, value, name + ".")
        elif hasattr(args, name):
            given = getattr(args, name)
            changes[f.name] = tuple(given) if isinstance(given, list) else given
    return dataclasses.replace(base, **changes)


def field_comments(cls: type) -> dict[str, str]:
    """Per field of a dataclass, the comment its source gives it: the one on its line, with the
    comment lines under it whose text is indented to go on from it (`#     more`), else the
    comment lines right above the field."""
    source = textwrap.dedent(inspect.getsource(cls))
    on_row: dict[int, str] = {}  # row -> its comment
    code_rows = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            on_row[tok.start[0]] = tok.string
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_rows.update(range(tok.start[0], tok.end[0] + 1))
    out = {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        rows = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        beside = [on_row[row] for row in rows if row in on_row]
        lines = beside[:1]
        if beside:  # beside the field, and the comment lines that go on from it
            row = rows[-1] + 1
            while row in on_row and row not in code_rows and on_row[row].startswith("#  "):
                lines.append(on_row[row])
                row += 1
        else:  # above it
            row = node.lineno - 1
            while row in on_row and row not in code_rows:
                lines.insert(0, on_row[row])
                row -= 1
        if lines:
            out[node.target.id] = " ".join(line.lstrip("#").strip() for line in lines)
    return out


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _kind(kind: Any, name: str) -> dict:
    """argparse's keywords for a field of type `kind`."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    if kind in (int, float, str):
        return {"type": kind, "metavar": kind.__name__.upper()}
    if origin is typing.Literal:
        return {"type": type(args[0]), "choices": args}
    if origin is tuple and args and args[0] in (int, float, str):
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": args[0], "nargs": "+", "metavar": args[0].__name__.upper()}
        if all(a is args[0] for a in args):
            return {"type": args[0], "nargs": len(args), "metavar": args[0].__name__.upper()}
    raise TypeError(f"config field {name}: no command-line option for type {kind}")
