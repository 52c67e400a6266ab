"""Which model produced a token: a leaf, so the step, the metrics and the events all read it."""

from __future__ import annotations

from enum import Enum


class Origin(str, Enum):
    DRAFTED = "drafted"  # proposed by the drafter and accepted by the target
    CORRECTED = "corrected"  # the target's resample after a rejected draft
    BONUS = "bonus"  # the target's own token after every draft was accepted
    TARGET = "target"  # target-only mode
    DRAFTER = "drafter"  # drafter-only mode
