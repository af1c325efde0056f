"""Planner behaviour: ILP optimality vs brute force, budgets met, baselines, errors.

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by."""

from __future__ import annotations

import numpy as np
import pytest

from snip.plan import PrecisionPlan
from snip.planner import Budget, Method, build_problem, solve
from snip.planner.ilp import solve_brute_force, solve_ilp
from snip.sensitivity import SensitivityTable, synthetic_table

TWO = ("fp8_e4m3_tile128", "fp4_e2m1_tile128")
FOUR = ("bf16", "mxfp8_e4m3", "mxfp4", "nvfp4")
SMALL = {"wq": (256, 256), "w1": (256, 768), "w2": (768, 256)}


def small_table(seed: int, cands=TWO, n_layers: int = 2) -> SensitivityTable:
    return synthetic_table(n_layers, cands, seed=seed, shapes=SMALL, tokens=64)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [0.3, 0.6, 0.9])
def test_ilp_equals_brute_force_per_layer(seed: int, budget: float) -> None:
    p = build_problem(small_table(seed, n_layers=3), budget)
    ilp, ref = solve_ilp(p), solve_brute_force(p)
    assert p.objective(ilp) == pytest.approx(p.objective(ref), rel=1e-9, abs=1e-12)
    assert not p.violations(ilp)


@pytest.mark.parametrize("seed", range(4))
def test_ilp_equals_brute_force_four_formats_time_budget(seed: int) -> None:
    t = synthetic_table(1, FOUR, seed=seed, shapes={"wq": (256, 256), "w2": (768, 256)},
                        tokens=64)
    for budget in (Budget(relative_time=0.5), Budget(fp4_fraction=0.5, relative_time=0.45),
                   Budget(fp4_fraction=0.4, memory_bytes=1.2e6)):
        p = build_problem(t, budget, candidates=FOUR, per_gemm=True)
        ilp, ref = solve_ilp(p), solve_brute_force(p)
        assert p.objective(ilp) == pytest.approx(p.objective(ref), rel=1e-9, abs=1e-12)


def test_budget_met_exactly_when_reachable() -> None:
    # 8 equal layers: 0.75 is reachable exactly (6 of 8), and the ILP must not overshoot
    # when FP4 costs more than FP8 everywhere.
    t = synthetic_table(8, TWO, seed=1, shapes={"wq": (128, 128)})
    plan = solve(t, 0.75)
    assert plan.meta["achieved"]["fp4_flop_fraction"] == pytest.approx(0.75)


@pytest.mark.parametrize("method", [m.value for m in Method if m is not Method.ORACLE])
@pytest.mark.parametrize("budget", [0.0, 0.5, 0.75, 0.8, 1.0])
def test_every_method_meets_budget(method: str, budget: float) -> None:
    t = synthetic_table(4, TWO, seed=3)
    plan = solve(t, budget, method=method, seed=7)
    assert isinstance(plan, PrecisionPlan)
    assert plan.meta["achieved"]["fp4_flop_fraction"] >= budget - 1e-9
    assert set(plan.layers) == set(t.layers)


def test_ilp_never_worse_than_baselines() -> None:
    t = synthetic_table(6, TWO, seed=5)
    best = solve(t, 0.75).meta["objective"]
    for m in Method:
        if m is not Method.ORACLE:
            assert best <= solve(t, 0.75, method=m).meta["objective"] + 1e-12


def test_baselines_hit_the_budget_when_the_ilp_does() -> None:
    t = synthetic_table(8, TWO, seed=2, shapes={"wq": (128, 128)})
    for m in ("layer_id", "layer_type", "min_rel_err", "random"):
        assert solve(t, 0.75, method=m).meta["achieved"]["fp4_flop_fraction"] == pytest.approx(0.75)


def test_layer_id_keeps_ends_high() -> None:
    t = synthetic_table(6, TWO, seed=0, shapes={"wq": (128, 128)})
    plan = solve(t, 0.5, method="layer_id")
    low = {n for n, e in plan.layers.items() if e["fprop"] == "fp4_e2m1_tile128"}
    assert low == {"layers.1.wq", "layers.2.wq", "layers.3.wq"}
    assert "layers.0.wq" not in low and "layers.5.wq" not in low


def test_per_gemm_and_plan_roundtrip(tmp_path) -> None:
    t = synthetic_table(2, FOUR, seed=0)
    plan = solve(t, 0.6, per_gemm=True, candidates=FOUR)
    plan.to_json(tmp_path / "p.json")
    again = PrecisionPlan.from_json(tmp_path / "p.json")
    assert again.layers == plan.layers


def test_pipeline_stages_each_meet_budget() -> None:
    t = synthetic_table(4, TWO, seed=4)
    names = t.names
    stages = (tuple(n for n in names if n.startswith(("layers.0.", "layers.1."))),
              tuple(n for n in names if n.startswith(("layers.2.", "layers.3."))))
    b = Budget(fp4_fraction=0.6, stages=stages)
    p = build_problem(t, b)
    for choice in (solve_ilp(p), ):
        for s in range(2):
            assert p.fp4_fraction(choice, p.stage == s) >= 0.6 - 1e-9
    for m in ("layer_id", "random"):
        assert solve(t, b, method=m).meta["achieved"]["fp4_flop_fraction"] >= 0.6 - 1e-9


def test_table_json_roundtrip(tmp_path) -> None:
    t = synthetic_table(2, TWO, seed=0)
    t.to_json(tmp_path / "t.json")
    again = SensitivityTable.from_json(tmp_path / "t.json")
    assert again.to_dict() == t.to_dict()
    assert solve(again, 0.5).layers == solve(t, 0.5).layers


@pytest.mark.parametrize("budget", [-0.1, 1.5])
def test_budget_out_of_range(budget: float) -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        solve(synthetic_table(1, TWO), budget)


def test_no_fp4_candidate_with_fp4_budget() -> None:
    t = synthetic_table(1, FOUR)
    with pytest.raises(ValueError, match="4-bit candidate"):
        solve(t, 0.5, candidates=("bf16", "mxfp8_e4m3"))


def test_infeasible_reports_largest_achievable() -> None:
    t = synthetic_table(2, FOUR)
    with pytest.raises(ValueError, match="largest achievable.*min relative time = 0.25"):
        solve(t, Budget(relative_time=0.1), candidates=FOUR)
    with pytest.raises(ValueError, match="infeasible"):
        solve(t, Budget(fp4_fraction=0.9, memory_bytes=1.0), candidates=FOUR)


def test_unknown_method_and_candidate() -> None:
    t = synthetic_table(1, TWO)
    with pytest.raises(ValueError, match="valid methods"):
        solve(t, 0.5, method="magic")
    with pytest.raises(ValueError, match="not measured"):
        solve(t, 0.5, candidates=("bf16", "nvfp4"))


def test_zero_budget_all_high_when_fp4_worse() -> None:
    t = synthetic_table(2, TWO)
    plan = solve(t, 0.0)
    assert plan.meta["achieved"]["fp4_flop_fraction"] == 0.0
    assert np.isclose(plan.meta["objective"], plan.meta["objective"])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("per_gemm", [False, True])
def test_knapsack_dp_equals_milp(seed: int, per_gemm: bool) -> None:
    from snip.planner.ilp import solve_milp_only

    t = synthetic_table(6, FOUR if seed % 2 else TWO, seed=seed)
    cands = FOUR if seed % 2 else TWO
    for r in (0.3, 0.75, 0.8):
        p = build_problem(t, r, per_gemm=per_gemm, candidates=cands)
        dp, milp_ = solve_ilp(p), solve_milp_only(p)
        assert p.objective(dp) == pytest.approx(p.objective(milp_), rel=1e-9, abs=1e-12)
        assert not p.violations(dp)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("profile", ["blackwell", "blackwell_ultra", "hopper"])
def test_time_dp_equals_milp(seed: int, profile: str) -> None:
    from snip.planner.ilp import _solve_dp, solve_milp_only

    t = synthetic_table(4, FOUR, seed=seed, shapes={"wq": (256, 256), "wk": (256, 64),
                                                    "w2": (768, 256)}, tokens=64)
    for b in (Budget(relative_time=0.3, profile=profile),
              Budget(relative_time=0.6, profile=profile),
              Budget(fp4_fraction=0.3, relative_time=0.45, profile=profile),
              Budget(fp4_fraction=0.7, relative_time=0.6, profile=profile)):
        p = build_problem(t, b, candidates=FOUR, per_gemm=True)
        try:
            ref = solve_milp_only(p)
        except ValueError:
            with pytest.raises(ValueError, match="infeasible"):
                solve_ilp(p)
            continue
        got = solve_ilp(p)
        assert not p.violations(got)
        assert p.objective(got) == pytest.approx(p.objective(ref), rel=1e-7, abs=1e-12)
        if b.fp4_fraction is None:
            assert _solve_dp(p) is not None  # the DP path really ran


@pytest.mark.parametrize("seed", range(3))
def test_time_dp_with_stages_equals_brute_force(seed: int) -> None:
    t = synthetic_table(2, FOUR, seed=seed, shapes={"wq": (256, 256), "w2": (768, 256)},
                        tokens=64)
    names = t.names
    b = Budget(relative_time=0.5, stages=(tuple(names[:2]), tuple(names[2:])))
    p = build_problem(t, b, candidates=FOUR)
    got, ref = solve_ilp(p), solve_brute_force(p)
    assert p.objective(got) == pytest.approx(p.objective(ref), rel=1e-9, abs=1e-12)
    assert not p.violations(got)


@pytest.mark.parametrize("seed", range(25))
def test_mckp_dp_equals_brute_force(seed: int) -> None:
    import itertools

    from snip.planner.ilp import solve_mckp_dp

    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    cost, weight = rng.normal(size=(n, k)), rng.integers(0, 7, (n, k))
    allowed = rng.random((n, k)) < 0.8
    allowed[np.arange(n), rng.integers(0, k, n)] = True
    cap = int(rng.integers(0, 20))
    feasible = [(sum(cost[u, p] for u, p in enumerate(ch)), ch)
                for ch in itertools.product(range(k), repeat=n)
                if all(allowed[u, p] for u, p in enumerate(ch))
                and sum(weight[u, p] for u, p in enumerate(ch)) <= cap]
    got = solve_mckp_dp(cost, weight, allowed, cap)
    if not feasible:
        assert got is None
        return
    assert got is not None and allowed[np.arange(n), got].all()
    assert weight[np.arange(n), got].sum() <= cap
    assert cost[np.arange(n), got].sum() == pytest.approx(min(v for v, _ in feasible))


def _core(p):
    from snip.planner.ilp import _solve_core, dominated

    keep = ~dominated(p)
    keep[np.arange(len(keep)), keep.argmax(1)] = True
    return _solve_core(p, keep, p.cost, 10.0)


@pytest.mark.parametrize("seed", range(8))
def test_combined_budget_core_equals_brute_force_when_both_bind(seed: int) -> None:
    """FP4 + time budgets where *both* constraints bind (dropping either changes the optimum):
    the Lagrangian core solver is exact."""
    t = synthetic_table(2, FOUR, seed=seed, shapes={"wq": (256, 256), "wk": (256, 64),
                                                    "w2": (768, 256)}, tokens=64)
    both = 0
    for fp4 in (0.3, 0.5, 0.7):
        for rel in (0.35, 0.45, 0.55):
            b = Budget(fp4_fraction=fp4, relative_time=rel)
            p = build_problem(t, b, candidates=FOUR, per_gemm=False)
            try:
                ref = solve_brute_force(p)
            except ValueError:
                with pytest.raises(ValueError, match="infeasible"):
                    solve_ilp(p)
                continue
            opt = p.objective(ref)
            relaxed = [p.objective(solve_brute_force(build_problem(t, r, candidates=FOUR)))
                       for r in (Budget(fp4_fraction=fp4), Budget(relative_time=rel))]
            both += all(r < opt - 1e-12 for r in relaxed)
            got = _core(p)
            assert got is not None and not p.violations(got)
            assert p.objective(got) == pytest.approx(opt, rel=1e-9, abs=1e-12)
            assert p.objective(solve_ilp(p)) == pytest.approx(opt, rel=1e-9, abs=1e-12)
    assert both >= 1  # the grid really has both-binding cases


@pytest.mark.parametrize("seed", range(3))
def test_combined_budget_core_with_stages_equals_brute_force(seed: int) -> None:
    t = synthetic_table(2, FOUR, seed=seed, shapes={"wq": (256, 256), "w2": (768, 256)},
                        tokens=64)
    names = t.names
    b = Budget(fp4_fraction=0.5, relative_time=0.45,
               stages=(tuple(names[:2]), tuple(names[2:])))
    p = build_problem(t, b, candidates=FOUR)
    ref = solve_brute_force(p)
    got = _core(p)
    assert got is not None and not p.violations(got)
    assert p.objective(got) == pytest.approx(p.objective(ref), rel=1e-9, abs=1e-12)
