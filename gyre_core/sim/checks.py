"""What a simulation refuses before it starts: a switch mode or batch order it does not
know, streaming without whole-group arrival, and a policy whose training units cannot hold
the training state (``CostModel.min_train_units``)."""

from __future__ import annotations

from gyre_core.scheduler import batching
from gyre_core.scheduler.base import Policy
from gyre_core.sim.costs import CostError, CostModel

MODES = ("migrate", "restart")


def check_options(mode: str, batch_order: str, costs: CostModel) -> None:
    """The run's switch mode and batch order, and the batch order streaming needs."""
    if mode not in MODES:
        raise ValueError(f"--switch-mode must be one of {', '.join(MODES)}, got {mode!r}")
    if batch_order not in batching.ORDERS:
        raise ValueError(
            f"--batch-order must be one of {', '.join(batching.ORDERS)}, got {batch_order!r}"
        )
    if costs.streaming and batch_order != batching.ARRIVAL:
        raise ValueError(
            "--streaming 1 takes groups as they finish: it needs --batch-order arrival"
        )


def check_training_fits(costs: CostModel, policy: Policy, units: int) -> None:
    """The training state fits on the units ``policy`` trains on (``units`` at most)."""
    need = costs.min_train_units
    fixed = getattr(policy, "train_units", None)  # a fixed split's training units
    if need > units or (isinstance(fixed, int) and fixed < need):
        have = units if fixed is None else fixed
        raise CostError(
            f"--params-b {costs.params_b:g}: the training state "
            f"({costs.train_state_gb:,.0f} GB) needs {need} training units, "
            f"and {policy.name} trains on at most {have}"
        )
