"""Streaming steps over a core and weight-only satellites (the paper's cells), on the
plain :class:`~gyre_core.train.trainer.Trainer`: one process per unit, the model whole in
each.

**Roles.** Rank 0 is the *core*: the authoritative weights and the only AdamW state.
Ranks 1.. are *satellites*: weights only (their trainer never steps, so its optimizer never
allocates state). Units join in rank order, core first, so the members of a step are
always ranks ``0..k-1`` and reduce over one of the process groups made in advance, one per
prefix (:func:`prefix_groups`: every rank builds them together, at start, in the same
order; gloo on CPU, NCCL on GPUs, the same calls).

**A step.** The core opens it (:meth:`StreamStep.open`): it publishes a snapshot (its
weights and version) and its first micro-steps (packed samples, each a file of its own),
and counts itself the first member. More micro-steps may follow while the step runs
(:meth:`StreamStep.feed`: the groups that finish meanwhile) until the step is sealed
(:meth:`StreamStep.seal`, with the whole batch's normaliser); :meth:`StreamStep.lead` does
all three at once for a batch that is whole. Every member claims micro-steps one at a time
from a shared counter (``TCPStore.add`` is atomic, so faster members take more; a claim
past the micro-steps fed so far waits for the next one, or ends at the seal), runs each
forward and backward with the loss unnormalised, and counts it done. A satellite may join
a step in progress (:meth:`StreamStep.serve`): it pulls the snapshot, claims what is left
and takes part in the reduction; it joins only as the next rank of the prefix (waiting for
a lower rank that has yet to join). Once the step is sealed and every micro-step done the
core closes the join window (a satellite that has not joined by then waits for the next
step), the members' gradients are summed on the core (``reduce`` over the prefix's group,
a flat buffer on the training device), and the core divides by the normaliser, clips and
steps AdamW (:meth:`StreamStep.finish`). The new weights reach the satellites in the next
step's snapshot; a satellite that leaves between steps has nothing to hand back.

**Offload.** The core's AdamW state goes to host memory while the core serves rollouts and
comes back to train (:func:`offload_optimizer`, :func:`restore_optimizer`), bit for bit.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gyre_core.train.collectives import adamw_step
from gyre_core.train.losses import LossStats, count_fresh
from gyre_core.train.trainer import Trainer
from gyre_core.trajectory.sample import PackedSample

CORE = 0
POLL_S = 0.002
CLOSED = "closed:"


def prefix_groups(world: int) -> dict[int, Any]:
    """The process groups of the prefixes ``0..k-1`` for ``k`` in ``2..world`` (a collective:
    every rank calls it once, at start, before any step)."""
    return {k: dist.new_group(list(range(k))) for k in range(2, world + 1)}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a member needs to join a step: the weights and the version its micro-steps
    train at (the micro-steps are files of their own, published as they are fed)."""

    weights: dict[str, torch.Tensor]
    version: int


class StreamStep:
    """One process's part in streaming steps; ``folder`` holds the snapshots and the
    micro-steps (shared by the members), ``store`` the claim counters and the join window."""

    def __init__(
        self, trainer: Trainer, store: Any, groups: dict[int, Any], folder: str | Path
    ) -> None:
        self.trainer, self.store, self.groups = trainer, store, groups
        self.folder = Path(folder)
        self.rank = dist.get_rank()
        self.claimed: list[int] = []  # the micro-steps this process ran in its last step
        self.local: dict[int, list[PackedSample]] = {}  # the core's: an open step's samples
        self.norm: dict[int, float] = {}  # the core's: a sealed step's normaliser

    # ------------------------------------------------------------------ the core

    def lead(self, step: int, samples: Sequence[PackedSample]) -> dict[str, float]:
        """The core's step ``step`` on a whole batch, ``samples`` (its micro-steps, in claim
        order): :meth:`open`, :meth:`seal` and :meth:`finish` at once."""
        t = self.trainer
        self.open(step, samples)
        self.seal(step, count_fresh(samples, t.version, t.staleness_bound))
        return self.finish(step)

    def open(self, step: int, samples: Sequence[PackedSample] = ()) -> None:
        """Open step ``step`` at the core's weights and version with its first micro-steps
        (more may follow: :meth:`feed`, until :meth:`seal`)."""
        if self.rank != CORE:
            raise RuntimeError(f"rank {self.rank} is a satellite: only the core leads a step")
        t = self.trainer
        weights = {n: v.detach().to("cpu") for n, v in t.model.state_dict().items()}
        path = self.folder / f"step-{step}.pt"
        torch.save(Snapshot(weights, t.version), path)
        (self.folder / f"step-{step - 1}.pt").unlink(missing_ok=True)  # its members are done
        shutil.rmtree(self.folder / f"step-{step - 1}", ignore_errors=True)
        (self.folder / f"step-{step}").mkdir(exist_ok=True)
        self.local[step] = []
        self.feed(step, samples)
        self.store.set(self._key(step, "members"), "1")
        self.store.set(self._key(step, "open"), str(path))

    def feed(self, step: int, samples: Sequence[PackedSample]) -> None:
        """More micro-steps for the open step ``step`` (in the core's process, from any
        thread): each is written, then counted, so a member never claims one unwritten."""
        mine = self.local[step]
        for sample in samples:
            torch.save(sample, self._sample_path(step, len(mine)))
            mine.append(sample)
            self.store.add(self._key(step, "fed"), 1)

    def seal(self, step: int, total: float) -> None:
        """Step ``step`` takes no more micro-steps; ``total``: its batch's normaliser
        (``count_fresh`` of every micro-step it was fed)."""
        self.norm[step] = total
        self.store.set(self._key(step, "sealed"), str(len(self.local[step])))

    def finish(self, step: int) -> dict[str, float]:
        """The core's work on step ``step`` until it is sealed and every micro-step is
        done, then the update: the step's metrics and the members it had (``members``)."""
        t = self.trainer
        stats = self._work(step, t.version)
        n = int(self.store.get(self._key(step, "sealed")))  # _work ends only once sealed
        while self._count(step, "done") < n:
            time.sleep(POLL_S)
        members = self._close(step)
        stats = self._reduce(members, stats)
        samples, total = self.local.pop(step), self.norm.pop(step)
        if total == 0:
            t.optimizer.zero_grad(set_to_none=True)
            return {**t.skipped(samples, t.version), "members": float(members)}
        for _, p in t.params:
            if p.grad is not None:
                p.grad.div_(total)
        out = t._optimizer_step()
        return {**stats.summary(t.config.kl_coef), **out, "members": float(members)}

    def _close(self, step: int) -> int:
        key = self._key(step, "members")
        while True:
            cur = self.store.get(key).decode()
            if self.store.compare_set(key, cur, CLOSED + cur).decode() == CLOSED + cur:
                return int(cur)

    # ------------------------------------------------------------------ satellites

    def serve(self, step: int, join_when: Callable[[int], bool] | None = None) -> bool:
        """A satellite's part in step ``step``: waits for it to open, then (once
        ``join_when(micro-steps done)`` holds, at once without it) joins if the window is
        still open and it is the prefix's next rank; returns whether it took part."""
        if self.rank == CORE:
            raise RuntimeError("the core leads its steps (lead), it does not serve them")
        path = self._wait(self._key(step, "open"))
        while join_when is not None and not join_when(self._count(step, "done")):
            if self.store.get(self._key(step, "members")).decode().startswith(CLOSED):
                return False
            time.sleep(POLL_S)
        if not self._join(step):
            return False
        snap: Snapshot = torch.load(path, weights_only=False)
        t = self.trainer
        t.model.load_state_dict(snap.weights)
        t.version = snap.version
        stats = self._work(step, snap.version)
        members = int(self._wait(self._key(step, "members"), CLOSED)[len(CLOSED) :])
        self._reduce(members, stats)
        t.optimizer.zero_grad(set_to_none=True)
        return True

    def _join(self, step: int) -> bool:
        """Join as the prefix's next rank: while an earlier rank has yet to join, wait for
        it (or for the window to close: then a later step)."""
        key = self._key(step, "members")
        while True:
            cur = self.store.get(key).decode()
            if cur.startswith(CLOSED) or int(cur) > self.rank:
                return False
            if int(cur) < self.rank:
                time.sleep(POLL_S)
                continue
            want = str(self.rank + 1)
            if self.store.compare_set(key, cur, want).decode() == want:
                return True

    # ------------------------------------------------------------------ every member

    def _work(self, step: int, version: int) -> LossStats:
        """Claim micro-steps until none is left: forward and backward of each, the
        gradients accumulated unnormalised (the core divides the sum once)."""
        t = self.trainer
        t.model.train()
        t.optimizer.zero_grad(set_to_none=True)
        stats = LossStats()
        self.claimed = []
        while (i := self._claim(step)) >= 0:
            self.claimed.append(i)
            loss, st = t._sample_loss(self._sample(step, i), version, 1.0)
            stats.add(st)
            if loss is not None:
                torch.autograd.backward(loss)
            self.store.add(self._key(step, "done"), 1)
        return stats

    def _claim(self, step: int) -> int:
        """The next micro-step's index once it is fed (a claim counter: faster members
        take more); -1 once the step is sealed with none left."""
        i = int(self.store.add(self._key(step, "next"), 1)) - 1
        sealed = self._key(step, "sealed")
        while i >= self._count(step, "fed"):
            if self.store.check([sealed]) and i >= int(self.store.get(sealed)):
                return -1
            time.sleep(POLL_S)
        return i

    def _sample(self, step: int, i: int) -> PackedSample:
        if step in self.local:  # the core fed it: in memory
            return self.local[step][i]
        sample: PackedSample = torch.load(self._sample_path(step, i), weights_only=False)
        return sample

    def _sample_path(self, step: int, i: int) -> Path:
        return self.folder / f"step-{step}" / f"{i}.pt"

    def _reduce(self, members: int, stats: LossStats) -> LossStats:
        """Sum the members' gradients and stats on the core (nothing with one member)."""
        if members < 2 or self.rank >= members:
            return stats
        t, group = self.trainer, self.groups[members]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for _, p in t.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        vec = torch.tensor(astuple(stats), dtype=torch.float64, device=flat.device)
        dist.reduce(flat, dst=CORE, group=group)
        dist.reduce(vec, dst=CORE, group=group)
        if self.rank != CORE:
            return stats
        offset = 0
        for _, p in t.params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
        return LossStats(*(float(x) for x in vec.tolist()))

    def _key(self, step: int, name: str) -> str:
        return f"stream/{step}/{name}"

    def _count(self, step: int, name: str) -> int:
        return int(self.store.add(self._key(step, name), 0))

    def _wait(self, key: str, prefix: str = "") -> str:
        while True:
            if self.store.check([key]):
                value = str(self.store.get(key).decode())
                if value.startswith(prefix):
                    return value
            time.sleep(POLL_S)


def offload_optimizer(trainer: Trainer) -> dict[int, dict[str, Any]]:
    """Move the AdamW state to host memory (pinned where a GPU trains) and drop it from the
    device: what the core does before it serves rollouts. Returns the host copy."""
    host: dict[int, dict[str, Any]] = {}
    pin = trainer.device.type == "cuda"
    for i, (_, p) in enumerate(trainer.params):
        state = trainer.optimizer.state.get(p)
        if not state:
            continue
        host[i] = {
            k: (v.detach().to("cpu").pin_memory() if pin else v.detach().to("cpu", copy=True))
            if isinstance(v, torch.Tensor)
            else v
            for k, v in state.items()
        }
        del trainer.optimizer.state[p]
    return host


def restore_optimizer(trainer: Trainer, host: dict[int, dict[str, Any]]) -> None:
    """Put the state :func:`offload_optimizer` took back where AdamW keeps it: the moments
    on the parameter's device, the ``step`` count where AdamW itself puts it (the host
    unless the optimizer is fused or capturable: ``collectives.adamw_step``)."""
    options = trainer.optimizer.defaults
    for i, (_, p) in enumerate(trainer.params):
        if i in host:
            step_on = adamw_step(p, options).device
            trainer.optimizer.state[p] = {
                k: v.to(step_on if k == "step" else p.device) if isinstance(v, torch.Tensor) else v
                for k, v in host[i].items()
            }
