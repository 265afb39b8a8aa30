#!/usr/bin/env python3
"""The documents' figures against the results files they cite.

    python experiments/doc_figures.py            # check: one line per disagreement, exit 1
    python experiments/doc_figures.py --write    # re-render the generated tables in the docs
    python experiments/doc_figures.py --list     # every checked figure: doc, results file, value

Two kinds of documented figure, both registered in `experiments/doc_figures_registry.py`:
- a **generated table**: what a doc holds between `<!-- table: NAME -->` and `<!-- end -->` is
  what `TABLES[NAME]` renders from its results files. `--write` puts it there; the check fails
  when the doc's copy differs, when a marker names no registered table or a registered table
  has no marker.
- a **quoted figure** (`Quote`): a phrase of a doc with figures in it (`{name:format}`), the
  results file it comes from and, per figure, the key path into that file (a tuple) or an
  expression of it (a function). The check fails when the phrase, with the figures the file
  gives, is not in the doc (compared with runs of whitespace as one space: prose wraps), or
  when the doc does not name the file.
With --summaries, also: every end-to-end results folder's summary.md is what
`experiments/report.py` makes of its results.json (off by default while report.py changes ahead
of re-measured runs; `python experiments/report.py DIR/results.json` re-writes one).

tests/unit/test_doc_figures.py runs the check (a few seconds; nothing is run or re-measured).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import csv
import json
import re
import string
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Docs whose figures are not checked yet: they are being rewritten after new measurements
# (issue 47). To check one: put its tables between markers and register them, register its
# quoted figures (doc_figures_registry.py: TABLES, QUOTES), take it off this tuple and off the
# expected set in tests/unit/test_doc_figures.py, then `python experiments/doc_figures.py --write`.
UNCHECKED_DOCS = ("docs/testbed.md",)

Value = tuple | Callable[[Any], Any]


@dataclass(frozen=True)
class Quote:
    """A phrase of `doc` whose `{name:format}` fields are figures of the results file `source`
    (or of several: then the values see {file: its data})."""

    doc: str
    source: str | tuple[str, ...]
    text: str
    values: dict[str, Value] = field(default_factory=dict)

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.source,) if isinstance(self.source, str) else self.source

    def data(self) -> Any:
        if isinstance(self.source, str):
            return load(self.source)
        return {s: load(s) for s in self.source}

    def fields(self) -> list[str]:
        return [f for _, f, _, _ in string.Formatter().parse(self.text) if f]

    def render(self) -> str:
        data = self.data()
        return self.text.format(**{k: value(data, v) for k, v in self.values.items()})


def Q(doc: str, source: str | tuple[str, ...], text: str, **values: Value) -> Quote:
    return Quote(doc, source, text, values)


@dataclass(frozen=True)
class Table:
    """The markdown between `<!-- table: name -->` and `<!-- end -->` in `doc`: `render` of the
    results files `sources` (loaded as `load` does, in that order)."""

    name: str
    doc: str
    sources: tuple[str, ...]
    render: Callable[..., str]


def at(data: Any, *path: Any) -> Any:
    """data[path[0]][path[1]]..., naming the missing key when there is none."""
    for i, key in enumerate(path):
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            raise KeyError(f"no {'/'.join(map(str, path[: i + 1]))}") from None
    return data


def value(data: Any, how: Value) -> Any:
    return how(data) if callable(how) else at(data, *how)


@cache
def load(source: str) -> Any:
    """A results file: JSON parsed, CSV as a list of rows (dicts of strings), anything else text."""
    path = REPO / source
    if path.suffix == ".json":
        return json.loads(path.read_text())
    if path.suffix == ".csv":
        with path.open(newline="") as fh:
            return list(csv.DictReader(fh))
    return path.read_text()


def squeeze(text: str) -> str:
    return " ".join(text.split())


_NAMED = re.compile(r"results/[\w./{},*\-]+")


def _expand(token: str) -> list[str]:
    """`results/ppo/spread.{json,png}` → the two paths (one level of braces, as the docs write)."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [
        p
        for alt in m.group(1).split(",")
        for p in _expand(token[: m.start()] + alt + token[m.end() :])
    ]


def named_files(text: str) -> set[str]:
    """The results files a doc names (`results/x/y.json`, `results/x/{a,b}.json`, `results/x/*.json`)."""
    names = set()
    for token in _NAMED.findall(text):
        for path in _expand(token.rstrip(".,)")):
            if "*" in path:
                names.update(str(p.relative_to(REPO)) for p in REPO.glob(path))
            else:
                names.add(path)
    return names


def docs_text(paths: Iterable[str]) -> dict[str, str]:
    return {p: (REPO / p).read_text() for p in sorted(set(paths))}


# --- generated tables --------------------------------------------------------------------------
_BLOCK = re.compile(
    r"(?P<open><!-- table: (?P<name>[\w.:-]+)[^>]*-->\n)(?P<body>.*?)(?P<close><!-- end -->)", re.S
)


def rendered(table: Table) -> str:
    body = table.render(*(load(s) for s in table.sources))
    return body if body.endswith("\n") else body + "\n"


def check_tables(tables: dict[str, Table], docs: dict[str, str]) -> list[str]:
    problems = []
    seen: set[str] = set()
    for doc, text in docs.items():
        for m in _BLOCK.finditer(text):
            name = m["name"]
            line = text.count("\n", 0, m.start()) + 1
            table = tables.get(name)
            if table is None:
                problems.append(f"{doc}:{line}: table '{name}' is not registered")
                continue
            if table.doc != doc:
                problems.append(f"{doc}:{line}: table '{name}' belongs to {table.doc}")
                continue
            seen.add(name)
            try:
                want = rendered(table)
            except Exception as e:  # a results file changed shape
                problems.append(f"{doc}:{line}: table '{name}': {table.sources}: {e!r}")
                continue
            if m["body"] != want:
                problems.append(
                    f"{doc}:{line}: table '{name}' differs from {', '.join(table.sources)} "
                    f"({_first_difference(m['body'], want)}); "
                    "`python experiments/doc_figures.py --write` re-renders it"
                )
            unnamed = [s for s in table.sources if s not in named_files(text)]
            if unnamed:
                problems.append(f"{doc}:{line}: table '{name}': the doc does not name {unnamed}")
    for name, table in tables.items():
        if name not in seen and table.doc in docs:
            problems.append(f"{table.doc}: no `<!-- table: {name} -->` ... `<!-- end -->` block")
    return problems


def _first_difference(have: str, want: str) -> str:
    for a, b in zip(have.splitlines(), want.splitlines()):
        if a != b:
            return f"doc: {a.strip()[:90]!r}, results: {b.strip()[:90]!r}"
    return f"doc has {len(have.splitlines())} lines, results give {len(want.splitlines())}"


def write_tables(tables: dict[str, Table], docs: dict[str, str]) -> list[str]:
    """Re-render every registered table block in place; returns the docs changed."""
    changed = []
    for doc, text in docs.items():

        def fill(m: re.Match, doc: str = doc) -> str:
            table = tables.get(m["name"])
            if table is None or table.doc != doc:
                return m[0]
            return m["open"] + rendered(table) + m["close"]

        new = _BLOCK.sub(fill, text)
        if new != text:
            (REPO / doc).write_text(new)
            changed.append(doc)
    return changed


# --- quoted figures ----------------------------------------------------------------------------
def check_quotes(quotes: list[Quote], docs: dict[str, str]) -> list[str]:
    problems = []
    squeezed = {d: squeeze(t) for d, t in docs.items()}
    for q in quotes:
        if q.doc not in docs:
            continue
        missing = set(q.fields()) - set(q.values)
        if missing:
            problems.append(f"{q.doc}: quote {q.text[:60]!r}: no value for {sorted(missing)}")
            continue
        where = ", ".join(q.sources)
        try:
            want = squeeze(q.render())
        except Exception as e:
            problems.append(f"{q.doc}: {where}: quote {q.text[:60]!r}: {e!r}")
            continue
        if want not in squeezed[q.doc]:
            problems.append(
                f"{q.doc}: {where} gives {want!r}; the doc has {_nearest(squeezed[q.doc], want)!r}"
            )
        unnamed = [s for s in q.sources if s not in named_files(docs[q.doc])]
        if unnamed:
            problems.append(f"{q.doc}: names no {', '.join(unnamed)} (quote {want[:60]!r})")
    return problems


def _nearest(text: str, want: str) -> str:
    """The doc's text where the phrase's longest matching prefix ends up (for the message)."""
    lo, hi = 0, len(want)
    while lo < hi:  # the longest prefix of `want` found in the text
        mid = (lo + hi + 1) // 2
        if want[:mid] in text:
            lo = mid
        else:
            hi = mid - 1
    if lo < 8:
        return "(nothing like it)"
    i = text.index(want[:lo])
    return text[i : i + len(want) + 10]


# --- end-to-end summaries ----------------------------------------------------------------------
def check_summaries() -> list[str]:
    from experiments import report
    from experiments.plots import e2e_results

    problems = []
    for path in e2e_results():
        md = path.parent / "summary.md"
        want = report.summary(json.loads(path.read_text()))
        if not md.exists() or md.read_text() != want:
            rel = path.relative_to(REPO)
            problems.append(
                f"{md.relative_to(REPO)} is not what experiments/report.py makes of {rel} "
                f"(`python experiments/report.py {rel}` re-writes it)"
            )
    return problems


# --- what results/ holds -----------------------------------------------------------------------
_FOLDER = re.compile(r"results/[\w./{},\-]*[\w}\-]")


def _pattern(token: str) -> re.Pattern:
    """A doc's name of results files as a regex: an upper-case placeholder (`contention-T`,
    `SCENARIO-TOPO-TIME`) stands for any name; a folder names what is in it and its folders' files
    (`results/e2e/loaded/` names `loaded/campus-0/results.json`)."""
    parts = re.split(r"(?<![a-z])[A-Z][A-Z-]*(?![a-z])", token.rstrip("/"))
    body = "[^/]+".join(re.escape(part) for part in parts)
    return re.compile(
        body + r"(/[^/]+){0,2}$"
        if token.endswith("/") or "." not in token.rsplit("/", 1)[-1]
        else body + "$"
    )


def uncited(files: Iterable[str], texts: Iterable[str]) -> list[str]:
    """The results files no doc names (a stale file, or a citation that went missing)."""
    names: set[str] = set()
    patterns = []
    for text in texts:
        names |= named_files(text)
        for token in _FOLDER.findall(text):
            for path in _expand(token):
                if path.count("/") >= 2 or path.endswith("/"):
                    patterns.append(_pattern(path))
    return [f for f in files if f not in names and not any(p.match(f) for p in patterns)]


# --- all of it ---------------------------------------------------------------------------------
def registry() -> tuple[dict[str, Table], list[Quote]]:
    from experiments import doc_figures_registry as r

    return {t.name: t for t in r.TABLES}, list(r.QUOTES)


def check(docs: dict[str, str] | None = None, summaries: bool = False) -> list[str]:
    tables, quotes = registry()
    if docs is None:
        docs = docs_text([t.doc for t in tables.values()] + [q.doc for q in quotes])
    problems = [f"{d}: checked here, but listed as unchecked" for d in docs if d in UNCHECKED_DOCS]
    problems += check_tables(tables, docs) + check_quotes(quotes, docs)
    if summaries:
        problems += check_summaries()
    return problems


def figures() -> list[tuple[str, str, str]]:
    """(doc, results file, figure) of every checked figure: each field of a quote, each number
    of a generated table."""
    tables, quotes = registry()
    out = []
    for q in quotes:
        try:
            text = squeeze(q.render())
        except Exception:  # check() reports it
            continue
        for f in q.fields():
            out.append(
                (q.doc, ", ".join(q.sources), f"{f} = {value(q.data(), q.values[f])!r} in {text!r}")
            )
    for t in tables.values():
        try:
            body = rendered(t)
        except Exception:  # check() reports it
            continue
        for n in re.findall(r"(?<![\w/.:-])\d[\d,]*(?:\.\d+)?", body):
            out.append((t.doc, ", ".join(t.sources), f"table {t.name}: {n}"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    how = p.add_mutually_exclusive_group()
    how.add_argument("--write", action="store_true", help="re-render the generated tables")
    how.add_argument("--list", action="store_true", help="list every checked figure")
    p.add_argument(
        "--summaries",
        action="store_true",
        help="also check every end-to-end summary.md against its results.json",
    )
    args = p.parse_args(argv)
    if args.write:
        tables, _ = registry()
        changed = write_tables(tables, docs_text(t.doc for t in tables.values()))
        print("re-rendered: " + (", ".join(changed) or "nothing changed"))
    if args.list:
        rows = figures()
        for doc, source, what in rows:
            print(f"{doc}\t{source}\t{what}")
        docs = {d for d, _, _ in rows}
        print(f"{len(rows)} figures in {len(docs)} docs", file=sys.stderr)
        return 0
    problems = check(summaries=args.summaries)
    for line in problems:
        print(line)
    tables, quotes = registry()
    n = len(figures())
    print(
        f"{n} figures ({len(tables)} tables, {len(quotes)} quotes): "
        + (f"{len(problems)} disagreements" if problems else "all agree with their results"),
        file=sys.stderr,
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
