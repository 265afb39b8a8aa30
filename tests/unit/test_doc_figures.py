"""Documented figures against the results files they cite (experiments/doc_figures.py), and what
results/ holds: every committed file cited by a doc, no plot or copy a command re-makes."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from experiments import doc_figures as df

REPO = Path(__file__).resolve().parents[2]


def test_every_documented_figure_agrees_with_its_results_file():
    problems = df.check()
    assert not problems, "\n".join(problems)


def test_the_registry_checks_figures_in_every_doc_but_the_one_being_rewritten():
    tables, quotes = df.registry()
    docs = {t.doc for t in tables.values()} | {q.doc for q in quotes}
    assert docs == {
        "docs/cluster.md",
        "docs/e2e.md",
        "docs/eade.md",
        "docs/lab.md",
        "docs/multi.md",
        "docs/ppo.md",
        "docs/sdn_app.md",
        "docs/seeds-multi.md",
        "docs/workloads.md",
    }
    assert not docs & set(df.UNCHECKED_DOCS)
    for q in quotes:
        assert q.fields(), q.text  # a quote without a figure checks nothing
        assert set(q.fields()) == set(q.values), q.text
        for source in q.sources:
            assert (REPO / source).is_file(), source
    for t in tables.values():
        for source in t.sources:
            assert (REPO / source).is_file(), source
    assert len(df.figures()) > 1000


def _docs() -> dict[str, str]:
    tables, quotes = df.registry()
    return df.docs_text([t.doc for t in tables.values()] + [q.doc for q in quotes])


def test_a_results_file_that_moved_fails_the_figures_quoted_from_it(monkeypatch):
    real = df.load

    def moved(source: str):
        data = copy.deepcopy(real(source))
        if source == "results/eade/ces.json":
            data["latency"]["eade-ddpg"]["p50_ms"] += 1.0
        return data

    monkeypatch.setattr(df, "load", moved)
    problems = df.check()
    assert len(problems) == 1 and "eade-ddpg p50" in problems[0], problems


def test_a_quoted_figure_changed_in_the_doc_fails():
    docs = _docs()
    doc = "docs/sdn_app.md"
    p50 = df.load("results/bench_sdn.json")["install_latency"]["ring_install_ms"]["p50"]
    quoted = f"p50 **{p50:.1f} ms**"
    assert quoted in docs[doc]
    problems = df.check({doc: docs[doc].replace(quoted, f"p50 **{p50 + 1:.1f} ms**")})
    assert len(problems) == 1 and "results/bench_sdn.json gives" in problems[0], problems


def test_a_generated_table_that_differs_from_its_file_fails_and_write_restores_it(
    tmp_path, monkeypatch
):
    docs = _docs()
    doc = "docs/lab.md"
    block = next(m for m in df._BLOCK.finditer(docs[doc]) if m["name"] == "lab-tta")
    changed = docs[doc].replace(block["body"], block["body"].replace("within spread", "beyond", 1))
    problems = df.check({doc: changed})
    assert len(problems) == 1 and "table 'lab-tta' differs" in problems[0], problems

    tables, _ = df.registry()
    for t in tables.values():  # read (and cached) from the repository before REPO moves
        for s in t.sources:
            df.load(s)
    (tmp_path / "docs").mkdir()
    (tmp_path / doc).write_text(changed)
    monkeypatch.setattr(df, "REPO", tmp_path)
    assert df.write_tables(tables, {doc: changed}) == [doc]
    assert (tmp_path / doc).read_text() == docs[doc]


def test_a_doc_that_no_longer_names_its_results_file_fails():
    docs = _docs()
    doc = "docs/sdn_app.md"
    docs[doc] = docs[doc].replace("results/bench_sdn.json", "the JSON")
    problems = df.check({doc: docs[doc]})
    assert any("names no results/bench_sdn.json" in p for p in problems), problems


def test_markers_without_a_table_and_tables_without_markers_fail():
    docs = _docs()
    doc = "docs/workloads.md"
    text = docs[doc].replace("<!-- table: workloads-tta -->", "<!-- table: workloads-typo -->")
    problems = df.check({doc: text})
    assert any("'workloads-typo' is not registered" in p for p in problems), problems
    assert any("no `<!-- table: workloads-tta -->`" in p for p in problems), problems


def test_named_files_expands_braces_and_globs():
    text = "results/ppo/spread.{json,png} and results/eade/results.{json,md}, results/multi/*.json"
    names = df.named_files(text)
    assert {"results/ppo/spread.json", "results/ppo/spread.png", "results/eade/results.md"} <= names
    assert "results/multi/summary.json" in names


def _git_ls(*args: str) -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    return subprocess.run(
        ["git", "ls-files", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()


def test_results_holds_what_a_doc_cites_and_no_file_a_command_re_makes():
    tracked = _git_ls("results")
    remade = [f for f in tracked if f.endswith(".png") or f.endswith("/results.csv")]
    assert not remade, f"re-made by `make figures`, not committed: {remade}"
    texts = [p.read_text() for p in [*(REPO / "docs").glob("*.md"), REPO / "README.md"]]
    assert not df.uncited(tracked, texts)
    # a stale file is found: one of the kinds issue 48 listed, and a run set no doc cites any more
    stale = ["results/eval_campus.json", "results/e2e/loaded-internet20/summary.json"]
    assert df.uncited(stale, texts) == stale


def test_git_ignores_the_plots_make_figures_writes():
    _git_ls()  # skips outside a git checkout
    paths = ["results/ppo/spread.png", "results/e2e/contention-ring/tta.png"]
    paths.append("results/e2e/loaded/campus-0/results.csv")
    out = subprocess.run(
        ["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True
    ).stdout.split()
    assert out == paths


def test_make_figures_has_a_maker_for_every_committed_plot_source():
    from experiments import plots

    for pattern in plots.BENCH_FIGURES:
        assert list((REPO / "results").glob(pattern)), pattern
    # every committed end-to-end run set's results.json has its plots made
    committed = {f for f in _git_ls("results/e2e") if f.endswith("/results.json")}
    assert committed and committed <= {str(p.relative_to(REPO)) for p in plots.e2e_results()}


def test_e2e_results_finds_a_run_set_whatever_its_header_holds(tmp_path):
    from experiments import plots

    # mixed-campus's header (scenario, machine, dilation) put "runs" past its first 4 kB
    (tmp_path / "long").mkdir()
    (tmp_path / "long" / "results.json").write_text(
        json.dumps({"version": 1, "scenario": {"description": "x" * 5000}, "runs": []})
    )
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "results.json").write_text(json.dumps({"scenario": "not a run set"}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text('{"scenario": {}, "runs": [')
    assert plots.e2e_results(tmp_path) == [tmp_path / "long" / "results.json"]
