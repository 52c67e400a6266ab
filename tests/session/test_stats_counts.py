"""The counts a stats line adds up: accepted drafts never outnumber the tokens a reply produced."""

from __future__ import annotations

from types import SimpleNamespace

from specchat.speculative.metrics import StatsRecorder


def step(drafted: int, accepted: int):
    return SimpleNamespace(
        drafted=drafted,
        accepted=accepted,
        draft=None,
        target_fed=True,
        target_seconds=0.1,
        target_timed=True,
        drafter_forwards=lambda: [],
    )


def test_a_step_cut_at_an_accepted_end_of_turn_counts_only_the_drafts_it_kept():
    """`say hi` read `10 tok … accepted 12/12 drafts`: a lookup step of 12 drafts, all accepted, whose 10th was the
    end-of-turn token. Its 10 tokens (the end-of-turn token among them) are 10 accepted drafts of 10."""
    recorder = StatsRecorder("spec", 12, prompt_tokens=20, reused_tokens=0)
    recorder.record(step(12, 12), kept=10)
    stats = recorder.finish()
    assert (stats.new_tokens, stats.accepted, stats.drafted, stats.rejections) == (10, 10, 10, 0)
    assert stats.accepted <= stats.new_tokens and stats.acceptance_rate == 1.0


def test_an_uncut_step_counts_as_before():
    recorder = StatsRecorder("spec", 4, prompt_tokens=20, reused_tokens=0)
    recorder.record(step(4, 2), kept=3)
    stats = recorder.finish()
    assert (stats.new_tokens, stats.accepted, stats.drafted, stats.rejections) == (3, 2, 4, 1)
