"""Scheduling policies: pure decisions from a cluster snapshot to role changes, rollout
admission and training steps (``colocate``, ``async``, ``elastic``)."""

from gyre_core.scheduler.base import Decision, Policy, Snapshot
from gyre_core.scheduler.policies import (
    POLICIES,
    Async,
    Colocate,
    Elastic,
    make_policy,
    policy_for,
)

__all__ = [
    "POLICIES",
    "Async",
    "Colocate",
    "Decision",
    "Elastic",
    "Policy",
    "Snapshot",
    "make_policy",
    "policy_for",
]
