"""experiments/calibrate_perfmodel.py without a testbed: which runs it plans, the job each run is
in the scheduler's model (the worker's flows and bytes), the prediction it checks a run against,
the per-flow byte check, and a re-fit of the committed calibration (made before the collective
checks) giving the same ring figures."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from experiments import calibrate_perfmodel as cal
from scheduler.jobs import worker_flows
from scheduler.perfmodel import COLLECTIVES, IterationModel, collective_steps, flow_bytes

REPO = Path(__file__).resolve().parents[2]
S = cal.Settings()
M = 1_000_000.0  # bytes of gradient
FITTED = IterationModel(efficiency=0.9, per_message_latency_s=0.001, overhead_s=0.002)


BE, EN = cal.BEST_EFFORT, cal.ENFORCED


def test_the_default_plan_profiles_every_model_then_fits_the_ring_then_checks_every_collective():
    """... on both networks, but the ring on the best-effort one only (each of its flows has a
    link to itself: held to its share, it is held to the link)."""
    plan = cal.planned_points(S)
    assert len(plan) == len(set(plan))
    models = [*S.models, *(m for m in S.check_models if m not in S.models)]
    assert plan[: len(models)] == [("ring", m, S.reference_mbps, BE) for m in models]
    ring_fit = {("ring", m, b, BE) for m in S.models for b in (*S.fit_mbps, *S.check_mbps)}
    checks = {
        (c, m, b, n)
        for c in COLLECTIVES
        for m in S.check_models
        for b in S.collective_mbps
        for n in (BE, EN)
        if c != "ring" or n == BE
    }
    assert set(plan) == {*plan[: len(models)], *ring_fit, *checks}
    assert {"resnet18", "mobilenetv2", "transformer"} <= set(S.check_models)
    assert cal.dataset_of(S, "resnet18") == "cifar10" and cal.dataset_of(S, "cnn") == S.dataset
    # the fit's runs get the fit's budget, the others the shorter one
    assert cal.ring_fit_run(S, ("ring", "mlp-large", 200.0, BE))
    assert not cal.ring_fit_run(S, ("ring", "resnet18", 200.0, BE))
    assert not cal.ring_fit_run(S, ("star", "mlp-large", 200.0, EN))
    only = cal.planned_points(replace(S, networks=(EN,), collectives=("ring", "all-to-all")))
    assert {p[3] for p in only if p[0] == "all-to-all"} == {EN}


def _flows(job) -> dict[str, float]:
    rank = {t.name: i for i, t in enumerate(job.tasks)}
    return {f"{rank[f.src]}>{rank[f.dst]}": f.bytes_per_iter for f in job.flows}


def test_each_run_is_the_job_the_worker_runs():
    """Task i is rank i: the flows and bytes the worker's collective sends (workloads/
    collectives.py; a star's server is rank 0, the tree's root too)."""

    def job(collective: str):
        return cal.calibration_job(S, collective, M, 100.0, 0.01)

    ring = 2 * 2 / 3 * M
    assert _flows(job("ring")) == {"0>2": ring, "1>0": ring, "2>1": ring}
    star = {"1>0": M, "0>1": M, "2>0": M, "0>2": M}
    assert _flows(job("star")) == star and _flows(job("tree")) == star  # k = 3: depth 1
    assert _flows(job("all-to-all")) == {
        f"{i}>{j}": 2 * M / 3 for i in range(3) for j in range(3) if i != j
    }
    custom = job("custom")  # a->b->c->a and the side loop a->c->a
    assert _flows(custom) == {"0>1": M, "1>2": M, "2>0": M, "0>2": M}
    assert worker_flows(custom) == ["0>1:1000000", "1>2:1000000", "2>0:1000000", "0>2:1000000"]
    assert all(len(job(c).tasks) == S.workers for c in COLLECTIVES)


@pytest.mark.parametrize(
    "collective, share, steps, phases",
    [
        ("ring", 1.0, 4, 1),  # every node sends one flow and receives one: the whole link each
        ("star", 0.5, 2, 2),  # the server's link carries both workers' flows; up, then down
        ("tree", 0.5, 2, 2),  # k = 3: one level, up then down
        ("all-to-all", 0.5, 2, 1),  # each node sends to and receives from both others
        ("custom", 0.5, 1, 1),  # a sends two flows, c receives two; the model counts one round
    ],
)
def test_the_prediction_is_the_schedulers_with_the_fitted_constants(
    collective, share, steps, phases
):
    mbps, compute = 100.0, 0.05
    cluster, job, decision = cal.modelled(S, (collective, "cnn", mbps, BE), M, compute * S.cpu)
    got = cal.predicted_iteration_s(cluster, job, decision, FITTED)
    nbytes = flow_bytes(collective, S.workers, M)
    comm = phases * nbytes * 8 / (share * mbps * FITTED.efficiency * 1e6)
    assert got == pytest.approx(compute + comm + steps * 0.001 + FITTED.overhead_s)
    assert steps == collective_steps(job.collective, len(job.tasks))


def test_a_rings_model_is_bucketed_as_ddp_buckets_its_gradient_and_only_the_rings():
    """ResNet-18's three buckets let the ring's prediction hide part of its all-reduce under
    the backward pass; the star of the same model (the worker's own exchange after the backward
    pass) keeps compute + collective."""
    nbytes = cal.model_bytes("resnet18", "cifar10")
    ring = cal.modelled(S, ("ring", "resnet18", 200.0, BE), nbytes, 1.4)
    assert len(ring[1].ddp_buckets) == 3 and sum(ring[1].ddp_buckets) == nbytes
    assert cal.modelled(S, ("star", "resnet18", 200.0, BE), nbytes, 1.4)[1].ddp_buckets == ()
    assert cal.predicted_iteration_s(*ring, FITTED) < cal.predicted_iteration_s(
        ring[0], replace(ring[1], ddp_buckets=()), ring[2], FITTED
    )


def _run(
    collective: str, mbps: float, iter_s: float, flows: dict | None, network: str = BE
) -> dict:
    return {
        "collective": collective,
        "network": network,
        "model": "cnn",
        "dataset": "digits",
        "mbps": mbps,
        "repeat": 0,
        "iters": 20,
        "gradient_bytes": M,
        "iter_s": iter_s,
        "compute_s": 0.05,
        "comm_s": iter_s - 0.05,
        "flow_bytes": flows,
        "cpu_busy_background": 0.0,
        "cpu_busy_during": 0.5,
    }


def test_a_check_compares_the_iteration_and_every_flows_bytes_with_the_model():
    s = replace(S, collectives=("star",), check_models=("cnn",))
    cluster, job, decision = cal.modelled(s, ("star", "cnn", 200.0, BE), M, 0.05 * s.cpu)
    predicted = cal.predicted_iteration_s(cluster, job, decision, FITTED)
    # Enforced, each flow is granted its share of the GRANTABLE part of the links, as CES does.
    _, _, granted = cal.modelled(s, ("star", "cnn", 200.0, EN), M, 0.05 * s.cpu)
    assert [f.rate_mbps for f in granted.flows] == pytest.approx(
        [f.rate_mbps * cal.GRANTABLE for f in decision.flows]
    )
    at_grants = cal.predicted_iteration_s(cluster, job, granted, FITTED)
    exact = {"1>0": M, "0>1": M, "2>0": M, "0>2": M}
    runs = [
        _run("ring", s.reference_mbps, 0.07, None),
        _run("star", 200.0, 1.3 * predicted, exact),
        _run("star", 200.0, 1.1 * at_grants, exact, EN),  # the same point, held to its grants
    ]
    [row, held] = cal.check(cal.aggregate(runs), s, FITTED)
    assert held["network"] == EN and held["predicted_iter_s"] == pytest.approx(at_grants)
    assert held["lower_bound_s"] == pytest.approx(2 * M * 8 / (100.0 * cal.GRANTABLE * 1e6))
    assert held["within_tolerance"] and cal.within([held]) == {"star (enforced)": "1/1"}
    assert row["collective"] == "star" and row["network"] == BE and row["steps"] == 2
    assert row["predicted_iter_s"] == pytest.approx(predicted)
    assert row["error"] == pytest.approx(0.3) and not row["within_tolerance"]
    # the bound: each worker's M over half the link up, then down, nothing else
    assert row["lower_bound_s"] == pytest.approx(2 * M * 8 / (100.0 * 1e6))
    assert row["flow_bytes_error"] == 0.0 and row["flow_bytes_within_tolerance"]
    assert cal.within([row]) == {"star": "0/1"}

    short = {**exact, "0>2": 0.9 * M}
    assert cal.bytes_check(short, job, 0.01)["flow_bytes_error"] == pytest.approx(0.1)
    stray = cal.bytes_check({**exact, "1>2": 40.0}, job, 0.01)
    assert stray["unmodelled_flows"] == ["1>2"] and not stray["flow_bytes_within_tolerance"]
    missing = cal.bytes_check({"1>0": M}, job, 0.01)
    assert missing["flow_bytes_error"] == 1.0  # a modelled flow that carried nothing


def test_the_options_select_collectives_and_models_and_keep_the_check_apart_from_the_fit(
    capsys,
):
    s, _, saved = cal.parse_args(
        ["--collectives", "star,custom", "--check-models", "resnet18", "--collective-mbps", "150"]
    )
    assert saved is None
    assert (s.collectives, s.check_models, s.collective_mbps) == (
        ("star", "custom"),
        ("resnet18",),
        (150.0,),
    )
    for argv in (["--collectives", "ps"], ["--collective-mbps", "100"], ["--check-mbps", "1000"]):
        with pytest.raises(SystemExit):
            cal.parse_args(argv)
    assert "the check would not be independent of the fit" in capsys.readouterr().err


def test_a_refit_of_the_committed_calibration_gives_its_figures(tmp_path: Path):
    """--refit measures nothing: the committed runs give the committed fit and every check."""
    out = tmp_path / "calibration.json"
    shutil.copy(REPO / "results" / "calibration.json", out)
    before = json.loads(out.read_text())
    assert cal.main(["--refit", "--out", str(out)]) == 0
    after = json.loads(out.read_text())
    assert after["fitted_model"] == pytest.approx(before["fitted_model"])
    assert after["within_tolerance"] == before["within_tolerance"]
    assert {c["collective"] for c in after["check"]} == set(cal.COLLECTIVES)
    # Relative to the value, and absolute for values near zero: another machine's BLAS moved a
    # check's error of -3.3417387e-4 in its 7th digit (-3.3417426e-4), 4e-10 apart.
    for old, new in zip(before["check"], after["check"], strict=True):
        for key, value in old.items():
            expected = (
                pytest.approx(value, rel=1e-6, abs=1e-9) if isinstance(value, float) else value
            )
            assert new[key] == expected, key
