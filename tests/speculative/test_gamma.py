"""Auto gamma knows that verifying gamma drafts feeds the target gamma+1 rows, and what rows cost."""

from __future__ import annotations

import pytest

from specchat.speculative.gamma import AutoGamma, RowCostFit


def settled(policy: AutoGamma, drafter_s: float, one_row_s: float, per_row_s: float, alpha: float) -> AutoGamma:
    """A policy that has seen many steps: drafter forwards of drafter_s, target forwards of
    one_row_s + per_row_s·(rows − 1) for drafts of 1 to 8 tokens, and acceptance alpha."""
    for step in range(60):
        drafted = 1 + step % 8
        policy.observe_cost("drafter", drafter_s)
        policy.observe_cost("target", one_row_s + per_row_s * drafted)
        policy.target_rows.observe(drafted + 1, one_row_s + per_row_s * drafted)
        policy.accepted = policy.accepted * policy.decay + alpha * 10
        policy.rejections = policy.rejections * policy.decay + (1 - alpha) * 10
    return policy


def test_the_row_fit_recovers_a_line_and_waits_for_varied_rows():
    fit = RowCostFit()
    for _ in range(10):
        fit.observe(5, 0.133)
    assert fit.fit() is None  # one row count: the slope cannot be told
    for rows in (1, 2, 3, 5, 9):
        fit.observe(rows, 0.077 + 0.014 * (rows - 1))
    one_row, per_row = fit.fit()
    assert one_row == pytest.approx(0.077, rel=0.05) and per_row == pytest.approx(0.014, rel=0.05)


def test_costly_rows_make_auto_gamma_draft_less_or_not_at_all():
    flat = settled(AutoGamma(), drafter_s=0.024, one_row_s=0.077, per_row_s=0.0, alpha=0.8)
    costly = settled(AutoGamma(), drafter_s=0.024, one_row_s=0.077, per_row_s=0.014, alpha=0.8)
    assert costly.planning_ratio == pytest.approx((0.024 + 0.014) / 0.077, rel=0.05)
    assert flat.planning_ratio == pytest.approx(0.024 / 0.077, rel=0.05)
    assert 1 <= costly.best_gamma() < flat.best_gamma()
    hopeless = settled(AutoGamma(), drafter_s=0.05, one_row_s=0.077, per_row_s=0.03, alpha=0.6)
    assert hopeless.best_gamma() == 0  # drafting cannot pay: target-only, probing now and then


def test_the_cost_ratio_shown_to_the_user_is_unchanged():
    """c in /stats stays drafter forward ÷ the target forwards actually timed."""
    costly = settled(AutoGamma(), drafter_s=0.024, one_row_s=0.077, per_row_s=0.014, alpha=0.8)
    mean_target = costly.target_s / costly.target_n
    assert costly.cost_ratio == pytest.approx(0.024 / mean_target)


def test_a_best_gamma_of_one_still_plans_a_draft_that_runs_on_while_the_drafter_is_sure():
    """Where the geometric model only pays for one token, easy stretches (code) still draft long:
    the draft ends by the path floor, not at one token."""
    marginal = settled(AutoGamma(), drafter_s=0.024, one_row_s=0.077, per_row_s=0.014, alpha=0.6)
    assert marginal.best_gamma() == 1
    plan = marginal.plan()
    assert plan.gamma == marginal.max_draft and 0 < plan.path_floor < 1
    hopeless = settled(AutoGamma(), drafter_s=0.05, one_row_s=0.077, per_row_s=0.03, alpha=0.6)
    assert hopeless.plan().path_floor == 0 and hopeless.plan().gamma <= 1  # off, or a plain probe
