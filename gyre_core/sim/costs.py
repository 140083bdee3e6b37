"""The simulator's cost model: one table shared by every policy.

Defaults describe H100/H200-class GPUs serving and training a large MoE model (~235B total,
~22B active parameters, the size of Qwen3-235B-A22B) in units of 8 GPUs (tensor-parallel 8
for serving, one data-parallel replica for training). Each default's reasoning is in
``docs/sim-costs.md``; ``[4/7]`` calibrates them against measured runs
(``CostModel.from_json`` reads the table the runtime writes).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from gyre_core.cluster import TRAIN


class CostError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class CostModel:
    gpus: int = 64
    gpus_per_unit: int = 8
    gpus_per_node: int = 8
    # Decode: a unit's total throughput with n sequences in flight is
    # decode_peak * n / (n + decode_half); one sequence alone runs at
    # decode_peak / (1 + decode_half) ~= 60 tok/s, 64 together at ~40 tok/s each.
    decode_peak_tok_s: float = 7_500.0
    decode_half: float = 124.0
    max_seqs_per_unit: int = 64  # KV-cache bound on long agent contexts
    prefill_tok_s: float = 20_000.0  # per unit; only newly appended tokens (prefix cache)
    train_tok_s: float = 6_000.0  # per training unit, tokens trained (forward + backward)
    switch_s: float = 30.0  # one role change: offload engine, load trainer state, or back
    # A direction's own cost where it differs (a waking engine is cheaper than a trainer
    # loading its state, or the reverse); 0 takes switch_s.
    switch_to_train_s: float = 0.0  # rollout -> train, after draining
    switch_to_rollout_s: float = 0.0  # train -> rollout, the new weights included
    weight_sync_s: float = 20.0  # publish a new version to the rollout engines
    drain_s: float = 30.0  # a draining unit's in-flight calls may finish within this
    rollouts_per_step: int = 64
    group_size: int = 8
    staleness: int = 2  # masking: a step s trains tokens of versions v with s - 1 - v <= this
    # admission: a rollout of step s may start at version v when s - 1 - v <= this (-1: the
    # masking bound); admitting further ahead masks the tokens that end up too old
    admission_staleness: int = -1
    max_concurrent: int = 0  # every policy: the most rollouts running at once (0: no cap)
    # dispatch: 0 admits continuously; k > 0 releases rollouts in bursts of k steps'
    # batches, the next once every rollout of the last has ended (the paper's baselines)
    burst_steps: int = 0
    # streaming training: 1 opens a step on the first whole groups ready and takes the rest
    # of its batch as they finish, units entering training joining it (sim/stream.py)
    streaming: int = 0
    step_overhead_s: float = 5.0  # per training step: optimizer, checkpoint bookkeeping
    # Memory: a step needs the training state (parameters, gradients, optimizer state) in GPU
    # memory. params_b billion parameters at train_bytes_per_param take at least
    # min_train_units units, each holding train_mem_share of its GPUs' gpu_mem_gb (the rest:
    # activations, buffers). A unit leaving training offloads its shard to host memory and
    # restores it on return, at host_gbps per GPU: part of its switch each way.
    params_b: float = 0.0  # 0: no memory model (a step may train on any number of units)
    train_bytes_per_param: float = 16.0
    gpu_mem_gb: float = 80.0
    train_mem_share: float = 0.5
    host_gbps: float = 50.0
    # Router: a session leaves its engine's prefix cache for the least loaded engine when
    # its own runs > balance_abs calls more and > balance_rel times as many (0: never).
    balance_abs: int = 32
    balance_rel: float = 1.5

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise CostError(f"--{_opt(f.name)}: must be finite, got {v}")
        positive = (
            "gpus",
            "gpus_per_unit",
            "gpus_per_node",
            "decode_peak_tok_s",
            "max_seqs_per_unit",
            "prefill_tok_s",
            "train_tok_s",
            "rollouts_per_step",
            "group_size",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise CostError(f"--{_opt(name)}: must be > 0, got {getattr(self, name)}")
        for name in (
            "decode_half",
            "switch_s",
            "switch_to_train_s",
            "switch_to_rollout_s",
            "weight_sync_s",
            "drain_s",
            "staleness",
            "step_overhead_s",
            "balance_abs",
        ):
            if getattr(self, name) < 0:
                raise CostError(f"--{_opt(name)}: must be >= 0, got {getattr(self, name)}")
        if self.admission_staleness < -1:
            raise CostError(
                f"--admission-staleness: must be >= -1 (-1: the staleness bound), "
                f"got {self.admission_staleness}"
            )
        if self.max_concurrent < 0:
            raise CostError(f"--max-concurrent: must be >= 0, got {self.max_concurrent}")
        if self.streaming not in (0, 1):
            raise CostError(f"--streaming: must be 0 or 1, got {self.streaming}")
        if self.burst_steps < 0:
            raise CostError(
                f"--burst-steps: must be >= 0 (0: continuous dispatch), got {self.burst_steps}"
            )
        for name in ("params_b", "train_bytes_per_param"):
            if getattr(self, name) < 0:
                raise CostError(f"--{_opt(name)}: must be >= 0, got {getattr(self, name)}")
        for name in ("gpu_mem_gb", "host_gbps"):
            if getattr(self, name) <= 0:
                raise CostError(f"--{_opt(name)}: must be > 0, got {getattr(self, name)}")
        if not 0 < self.train_mem_share <= 1:
            raise CostError(f"--train-mem-share: must be in (0, 1], got {self.train_mem_share}")
        if self.balance_rel < 1:
            raise CostError(f"--balance-rel: must be >= 1, got {self.balance_rel}")
        if self.rollouts_per_step % self.group_size:
            raise CostError(
                f"--rollouts-per-step {self.rollouts_per_step} is not a multiple of "
                f"--group-size {self.group_size}"
            )

    @property
    def units(self) -> int:
        return self.gpus // self.gpus_per_unit

    def switch_to(self, role: str) -> float:
        """Seconds a unit takes to change into ``role`` (``train`` or ``rollout``): the
        table's switch, plus the restore (into training) or offload (out of it) of its
        shard of the training state under the memory model."""
        own = self.switch_to_train_s if role == TRAIN else self.switch_to_rollout_s
        return (own or self.switch_s) + self.offload_s

    @property
    def train_state_gb(self) -> float:
        return self.params_b * self.train_bytes_per_param

    @property
    def min_train_units(self) -> int:
        """The fewest units that hold the training state (1 without a memory model)."""
        if self.params_b <= 0:
            return 1
        per_unit = self.gpus_per_unit * self.gpu_mem_gb * self.train_mem_share
        return max(1, math.ceil(self.train_state_gb / per_unit - 1e-9))

    @property
    def offload_s(self) -> float:
        """Seconds to move one GPU's shard of the training state (as held by the fewest
        units) to host memory, or back (0 without a memory model)."""
        if self.params_b <= 0:
            return 0.0
        shard = self.train_state_gb / (self.min_train_units * self.gpus_per_unit)
        return shard / self.host_gbps

    @property
    def admission_ahead(self) -> int:
        """How many versions ahead of the policy a rollout may start."""
        return self.staleness if self.admission_staleness < 0 else self.admission_staleness

    def seq_rate(self, n: int) -> float:
        """Tokens/s of each of ``n`` sequences decoding together on one unit."""
        return self.decode_peak_tok_s / (max(n, 1) + self.decode_half)

    def step_s(self, tokens: int, units: int) -> float:
        """How long a training step of ``tokens`` takes on ``units`` training units."""
        return self.step_overhead_s + tokens / (self.train_tok_s * units)

    @property
    def best_decode_tok_s(self) -> float:
        """A unit's throughput at its sequence cap: the most it ever decodes."""
        n = self.max_seqs_per_unit
        return n * self.seq_rate(n)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CostModel:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - names)
        if unknown:
            raise CostError(f"unknown cost field(s): {', '.join(unknown)}")
        return cls(**obj)

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        return cls.from_json(json.loads(Path(path).read_text()))


def _opt(name: str) -> str:
    return name.replace("_", "-")
