"""Hypothesis strategies shared by the fuzz tests: the bad input an outsider can send or write.

`mutated(valid)` makes one change to a valid mapping — a field dropped, an unknown field added, a
field's value replaced by something of the wrong type or out of range — and says which field it
touched, so a test can check that a refusal names it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

# Names an API must not take as identifiers: path separators, control characters, dots, empty.
bad_names = st.one_of(
    st.sampled_from(
        [
            "",
            ".",
            "..",
            "../etc/passwd",
            "a/b",
            "a\\b",
            "a\nb",
            "a\n",
            "a\x00b",
            "a\tb",
            " a",
            "a b",
            "-a",
            "x" * 300,
            "ü",
            "a;rm -rf /",
            "%2e%2e",
        ]
    ),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20),
)

# Numbers at and beyond every limit, and values that only look like numbers.
bad_numbers = st.sampled_from(
    [
        float("nan"),
        float("inf"),
        float("-inf"),
        -1,
        -1e-9,
        0,
        0.0,
        10**400,
        -(10**400),
        1e308,
        2**64,
        2**63 - 1,
        True,
        False,
        "1",
        "NaN",
        None,
        [],
        {},
    ]
)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    bad_numbers,
    st.floats(allow_nan=True, allow_infinity=True),
    bad_names,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

# Bodies that are not JSON, or JSON that the decoder cannot take (too deep, bad UTF-8).
raw_bodies = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [
            b"{",
            b"{not json",
            b"[1, 2",
            b'{"a": }',
            b"\xff\xfe\x00",
            b"nul",
            b'"\xc3"',
            b"[" * 5000,
            b'{"a":' * 5000,
            b"1e999999",
            b"-",
            b"9" * 5000,
        ]
    ),
    st.text(max_size=100).map(str.encode),
)


@dataclass(frozen=True)
class Mutation:
    body: Any
    field: str  # the top-level field changed ("" when the whole body was replaced)
    kind: str  # "drop" | "unknown" | "value" | "body"


def mutated(valid: dict) -> st.SearchStrategy[Mutation]:
    """One change to `valid` (a mapping a handler accepts)."""
    keys = sorted(valid)
    drop = st.sampled_from(keys).map(
        lambda k: Mutation({x: v for x, v in valid.items() if x != k}, k, "drop")
    )
    unknown = (
        st.text(min_size=1, max_size=12)
        .filter(lambda k: k not in valid)
        .map(lambda k: Mutation({**valid, k: 1}, k, "unknown"))
    )
    value = st.tuples(st.sampled_from(keys), json_values).map(
        lambda kv: Mutation({**valid, kv[0]: kv[1]}, kv[0], "value")
    )
    body = st.one_of(json_scalars, st.lists(json_values, max_size=3)).map(
        lambda b: Mutation(b, "", "body")
    )
    return st.one_of(drop, unknown, value, body)
