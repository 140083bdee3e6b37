"""The trainer: rollouts -> packed samples -> staleness-corrected policy loss -> AdamW step.

One step is ``prepare`` (trees, advantages, packing) -> shard the samples across ``dp_width``
data-parallel replicas, balanced by tokens -> ``compute_grads`` per shard -> ``apply``
(average the replicas' gradients, clip, AdamW). The Ray runtime runs ``compute_grads`` on
its training units and ``apply`` on each replica after the all-reduce; ``step`` does the
same in one process, one shard after another (gradient accumulation).

The loss of a batch is a mean over the *whole* batch (``train.average``): each shard divides
its summed loss by ``count_fresh / dp_width``, so that the mean of the shards' gradients is
the gradient of the batch, however the samples were split. A step therefore does not depend on
``dp_width`` (up to floating-point summation order).

A step does not depend on the order its rollouts arrive in: ``prepare`` sorts them by group
and rollout id first, so the trees, samples and shards (and so every floating-point sum) are
the same however the rollouts finished. With ``behaviour="trainer"`` it does not depend on
the engines' numerics either, for the tokens the current weights made (see ``_sample_loss``):
together these make a colocate run, whose every token is on-policy, repeat exactly.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, get_args

import numpy as np
import torch
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from gyre_core.train.config import TrainConfig, TrainSetup
from gyre_core.train.losses import (
    LossSettings,
    LossStats,
    TokenBatch,
    combine_loss,
    count_fresh,
    fresh_mask,
    get_loss,
)
from gyre_core.train.memory import apply_activation_checkpointing, tree_logprobs
from gyre_core.train.tree_attention import Impl
from gyre_core.trajectory.format import Rollout
from gyre_core.trajectory.pack import pack_trees
from gyre_core.trajectory.sample import PackedSample
from gyre_core.trajectory.tree import PrefixTree

WEIGHTS_FILE = "model.safetensors"
# The model's attention implementation each tree-attention path needs (see tree_forward).
BACKENDS: dict[str, tuple[str, ...]] = {
    "dense": ("eager", "sdpa", "flex_attention"),
    "flex": ("flex_attention",),
    "sparse": ("gyre_tree",),
}


@dataclass(frozen=True, slots=True)
class TrainerOptions:
    """The trainer's own knobs beyond the run's ``train`` section (``TrainConfig``, which
    holds every setting a run config can change): research scripts and tests set these."""

    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    attention: Impl = "dense"  # the tree-attention path (see BACKENDS)

    def __post_init__(self) -> None:
        def bad(name: str, want: str) -> ValueError:
            return ValueError(f"TrainerOptions.{name} must be {want}, got {getattr(self, name)!r}")

        if not self.weight_decay >= 0:
            raise bad("weight_decay", ">= 0")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise bad("betas", "two numbers in [0, 1)")
        if not self.eps > 0:
            raise bad("eps", "> 0")
        if self.attention not in get_args(Impl):
            raise bad("attention", f"one of {', '.join(get_args(Impl))}")


Grads = dict[str, torch.Tensor]


class BatchPlan:
    """From rollouts to packed samples: what a step trains, decided without the model
    (the trainer, and a driver that holds no model, both use it). ``config`` is the run's
    ``train`` section, ``staleness_bound`` the scheduler's, ``seed`` the run's (paths')."""

    def __init__(self, config: TrainConfig, staleness_bound: int, seed: int = 0) -> None:
        self.config, self.staleness_bound, self.seed = config, staleness_bound, seed

    def prepare(
        self,
        rollouts: Iterable[Rollout],
        current_version: int,
        trees: dict[str, PrefixTree] | None = None,
    ) -> list[PackedSample]:
        """Trees per group -> advantages as token weights -> samples of <= max_tokens.

        ``trees``: what ``weigh`` made of these rollouts, when the caller keeps them (the
        runtime reuses a step's trees for its ``tree_ready`` figures)."""
        if trees is None:
            trees = self.weigh(rollouts, current_version)
        return pack_trees(trees.values(), self.config.max_tokens)

    def weigh(self, rollouts: Iterable[Rollout], current_version: int) -> dict[str, PrefixTree]:
        """The rollouts' trees, one per group in group id order, weighted as this trainer
        trains them (``config.weighting``), then path-sampled (``config.path_sampling``,
        drawn with the run's seed at ``current_version``; a no-op by default).

        Stale tokens stay in the trees (the loss drops and counts them); a token newer
        than ``current_version`` means the caller mixed up versions, and is refused."""
        # A canonical order: the same set of rollouts gives the same samples, bit for bit.
        rollouts = sorted(rollouts, key=lambda r: (r.group_id, r.rollout_id))
        if not rollouts:
            raise ValueError("no rollouts to train on")
        for r in rollouts:
            for c in r.calls:
                if len(c.versions) and int(c.versions.max()) > current_version:
                    raise ValueError(
                        f"rollout {r.rollout_id!r} call {c.call_id!r} has tokens of version "
                        f"{int(c.versions.max())}, newer than the current version {current_version}"
                    )
        trees = self.config.weighting.trees(rollouts, scaled=False)  # scaled last, below
        for tree in trees.values():
            self.config.path_sampling.apply(tree, self.seed, current_version)
        # Last (after anything that changes Node.taken): train.average's scales
        self.config.weighting.scale(trees.values(), current_version - self.staleness_bound)
        return trees

    def skipped(self, samples: Sequence[PackedSample], current_version: int) -> dict[str, float]:
        """The metrics of a step whose batch has no token fresh enough to train: the
        weights and the version stay as they were."""
        stats = LossStats(samples=float(len(samples)))
        for s in samples:
            stats.stale_dropped += fresh_mask(s, current_version, self.staleness_bound)[1]
        return {**stats.summary(self.config.kl_coef), "skipped": 1.0}


class Trainer:
    """Trains ``model`` (a transformers causal LM) on rollouts; see the module docstring.

    ``config`` is the run's ``train`` section; ``staleness_bound`` (the run's
    ``scheduler.staleness_bound``: tokens older than that many versions are not trained) and
    ``seed`` (the run's) come from the rest of the run config, ``options`` are the trainer's
    own knobs (:class:`TrainerOptions`). :meth:`for_run` takes the first three from a
    :class:`~gyre_core.train.config.TrainSetup`.
    ``ref_model`` is the frozen reference for the KL penalty (required when ``kl_coef > 0``).
    ``version`` is the policy version of the current weights; each optimizer step adds one.
    Staleness is measured against ``current_version`` where a method takes one (default:
    ``version``). The constructor seeds torch's global RNG with ``seed``.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        config: TrainConfig,
        ref_model: PreTrainedModel | None = None,
        *,
        staleness_bound: int,
        seed: int,
        options: TrainerOptions | None = None,
        version: int = 0,
    ) -> None:
        options = options or TrainerOptions()
        if config.kl_coef > 0 and ref_model is None:
            raise ValueError("train.kl_coef > 0 needs a ref_model")
        if config.logit_chunk < 0:
            raise ValueError(f"train.logit_chunk must be >= 0, got {config.logit_chunk}")
        if config.ratio_cap and not config.ratio_cap > 1 + config.clip_high:
            raise ValueError(
                f"train.ratio_cap must be > 1 + train.clip_high "
                f"({1 + config.clip_high}) or 0, got {config.ratio_cap!r}"
            )
        for role, m in (("model", model), ("ref_model", ref_model)):
            backend = str(m.config._attn_implementation) if m is not None else None
            if backend is not None and backend not in BACKENDS[options.attention]:
                raise ValueError(
                    f"TrainerOptions.attention={options.attention!r} needs a {role} built with "
                    f"attn_implementation in {BACKENDS[options.attention]}, not {backend!r}"
                )
        if config.activation_checkpointing:
            apply_activation_checkpointing(model)
        self.model = model
        self.config = config
        self.staleness_bound = staleness_bound
        self.seed = seed
        self.options = options
        self.loss_settings = LossSettings.of(config)
        self.ref_model = ref_model
        if ref_model is not None:
            torch.nn.Module.train(ref_model, False)
            ref_model.requires_grad_(False)
        self.version = version
        self.loss_fn = get_loss(config.loss)
        self.plan = BatchPlan(config, staleness_bound, seed)
        self.rebuild_optimizer()
        torch.manual_seed(seed)

    def rebuild_optimizer(self) -> None:
        """A fresh AdamW over the model's trainable parameters, with the trainer's
        settings: at construction, and after the parameters were replaced (sharded)."""
        self.params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(
            [p for _, p in self.params],
            lr=self.config.lr,
            betas=self.options.betas,
            eps=self.options.eps,
            weight_decay=self.options.weight_decay,
        )

    @classmethod
    def for_run(
        cls, model: PreTrainedModel, setup: TrainSetup, ref_model: PreTrainedModel | None = None
    ) -> Trainer:
        """The trainer of a run, from what it takes of the run's config (``setup``: every
        replica of a run is built this way)."""
        return cls(
            model,
            setup.train,
            ref_model,
            staleness_bound=setup.staleness_bound,
            seed=setup.seed,
        )

    def settings(self) -> dict[str, Any]:
        """Everything besides the weights that a step depends on, as JSON values: what a
        checkpoint records and a resume must match."""
        options = asdict(self.options)
        options["betas"] = list(self.options.betas)
        return {
            **asdict(self.config),
            "staleness_bound": self.staleness_bound,
            "seed": self.seed,
            **options,
        }

    @property
    def device(self) -> torch.device:
        return self.model.device

    # ------------------------------------------------------------------ data

    def prepare(
        self,
        rollouts: Iterable[Rollout],
        current_version: int,
        trees: dict[str, PrefixTree] | None = None,
    ) -> list[PackedSample]:
        """The batch's packed samples (:meth:`BatchPlan.prepare`)."""
        return self.plan.prepare(rollouts, current_version, trees)

    def weigh(self, rollouts: Iterable[Rollout], current_version: int) -> dict[str, PrefixTree]:
        """The batch's weighted trees (:meth:`BatchPlan.weigh`)."""
        return self.plan.weigh(rollouts, current_version)

    # ------------------------------------------------------------------ gradients

    def _sample_loss(
        self, sample: PackedSample, current_version: int, normalise: float
    ) -> tuple[torch.Tensor | None, LossStats]:
        keep_np, stale = fresh_mask(sample, current_version, self.staleness_bound)
        if not keep_np.any():
            return None, LossStats(stale_dropped=float(stale), samples=1.0)
        dev = self.device
        ids = torch.from_numpy(sample.input_ids).to(dev)
        pos = torch.from_numpy(sample.position_ids).to(dev)
        parent = torch.from_numpy(sample.parent).to(dev)
        idx = torch.from_numpy(keep_idx := np.flatnonzero(keep_np)).to(dev)
        if bool((parent[idx] < 0).any()):
            raise ValueError("a root token cannot be trainable: nothing predicts it")
        c = self.config
        att = self.options.attention
        lp, entropy = tree_logprobs(
            self.model, ids, pos, parent, idx, att, chunk=c.logit_chunk, precision=c.precision
        )
        ref_lp = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref_lp = tree_logprobs(
                    self.ref_model, ids, pos, parent, idx, att, chunk=c.logit_chunk, entropy=False
                )[0].to(lp.dtype)

        def column(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(device=dev, dtype=lp.dtype)[idx]

        behaviour = column(sample.logprob)
        if self.config.behaviour == "trainer":
            # A token of the current version was sampled from these very weights: its
            # behaviour log-prob *is* lp. The engine's figure differs from it only by
            # numerics (in which calls shared its batch); taking lp makes the ratio exactly 1.
            current = torch.from_numpy(sample.version == current_version).to(dev)[idx]
            behaviour = torch.where(current, lp.detach(), behaviour)
        seq = torch.from_numpy(sample.sequences(keep_idx)).to(dev)
        batch = TokenBatch(
            lp, behaviour, column(sample.advantage), ref_lp, seq, column(sample.scale)
        )
        loss, stats = combine_loss(self.loss_fn, batch, self.loss_settings, normalise)
        stats.entropy = float(entropy.sum())
        stats.stale_dropped = float(stale)
        stats.staleness = float((current_version - sample.version[keep_np]).sum())
        return loss, stats

    def compute_grads(
        self,
        samples: Sequence[PackedSample],
        normalise: float | None = None,
        *,
        current_version: int | None = None,
    ) -> tuple[Grads, LossStats]:
        """Gradients of ``sum(sample losses) / normalise`` (accumulated sample by sample)
        and the detached loss stats. ``normalise`` defaults to the fresh tokens of
        ``samples`` (``count_fresh``); a replica of ``n`` whose gradients ``apply`` will average
        with the others' passes ``count_fresh of the whole batch / n`` (see :meth:`step`)."""
        cv = self.version if current_version is None else current_version
        if normalise is None:
            normalise = float(max(1, count_fresh(list(samples), cv, self.staleness_bound)))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        stats = LossStats()
        for s in samples:
            loss, st = self._sample_loss(s, cv, normalise)
            stats.add(st)
            if loss is not None:
                torch.autograd.backward(loss)
        grads = {
            n: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for n, p in self.params
        }
        self.optimizer.zero_grad(set_to_none=True)
        return grads, stats

    def apply(self, grads_list: Sequence[Grads]) -> dict[str, float]:
        """Average the replicas' gradients, clip their norm, take one AdamW step."""
        if not grads_list:
            raise ValueError("apply needs the gradients of at least one replica")
        for name, p in self.params:
            parts = []
            for i, g in enumerate(grads_list):
                if name not in g:
                    raise ValueError(f"replica {i}'s gradients lack parameter {name!r}")
                if g[name].shape != p.shape:
                    raise ValueError(
                        f"replica {i}'s gradient for {name!r} has shape {tuple(g[name].shape)}, "
                        f"expected {tuple(p.shape)}"
                    )
                parts.append(g[name].to(device=p.device, dtype=p.dtype))
            p.grad = torch.stack(parts).sum(0) / len(parts)
        return self._optimizer_step()

    def reset_optimizer(self) -> None:
        """Forget AdamW's moments and step counts (the learning rates stay): the next step
        starts as a fresh optimizer would, e.g. RL after a supervised warm start."""
        self.optimizer.state.clear()

    def _optimizer_step(self) -> dict[str, float]:
        params = [p for _, p in self.params]
        limit = self.config.max_grad_norm  # 0: no clipping
        norm = torch.nn.utils.clip_grad_norm_(params, limit or float("inf"))
        if isinstance(norm, DTensor):  # sharded parameters (train/sharded.py)
            norm = norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        return {"grad_norm": float(norm), "lr": self.config.lr, "version": float(self.version)}

    def step(
        self,
        rollouts: Iterable[Rollout],
        current_version: int | None = None,
        dp_width: int = 1,
    ) -> dict[str, float]:
        """One RL step on ``rollouts``; returns the step's metrics. A batch with no token
        fresh enough to train leaves the weights and version as they were (``skipped``)."""
        if isinstance(dp_width, bool) or not isinstance(dp_width, int) or dp_width < 1:
            raise ValueError(f"dp_width must be an integer >= 1, got {dp_width!r}")
        cv = self.version if current_version is None else current_version
        samples = self.prepare(rollouts, cv)
        total = count_fresh(samples, cv, self.staleness_bound)
        if total == 0:
            return self.skipped(samples, cv)
        stats = LossStats()
        grads = []
        for shard in shard_by_tokens(samples, dp_width):
            g, st = self.compute_grads(shard, total / dp_width, current_version=cv)
            grads.append(g)
            stats.add(st)
        return {**stats.summary(self.config.kl_coef), **self.apply(grads), "skipped": 0.0}

    def skipped(self, samples: Sequence[PackedSample], current_version: int) -> dict[str, float]:
        """The metrics of a step with nothing fresh to train (:meth:`BatchPlan.skipped`)."""
        return self.plan.skipped(samples, current_version)

    # ------------------------------------------------------------------ warm start

    def sft_step(
        self, batch: Sequence[PackedSample] | Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> dict[str, float]:
        """One supervised step: mean cross-entropy over the batch's target tokens only.

        ``batch`` holds packed samples (their trainable tokens are the targets; advantages
        are ignored) or ``(prompt_ids, target_ids)`` pairs, e.g. scripted demonstrations.
        It is an optimizer step like any other, so it advances ``version``."""
        samples = [b if isinstance(b, PackedSample) else demo_sample(*b) for b in batch]
        n = sum(int(s.trainable.sum()) for s in samples)
        if n == 0:
            raise ValueError("sft_step needs at least one target token")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for s in samples:
            loss = self._sft_loss(s, n)
            torch.autograd.backward(loss)
            total += float(loss.detach())
        return {"sft_loss": total, "tokens": float(n), **self._optimizer_step()}

    def _sft_loss(self, s: PackedSample, normalise: float) -> torch.Tensor:
        """The cross-entropy of ``s``'s target (trainable) tokens, summed, over ``normalise``."""
        dev = self.device
        ids = torch.from_numpy(s.input_ids).to(dev)
        parent = torch.from_numpy(s.parent).to(dev)
        pos = torch.from_numpy(s.position_ids).to(dev)
        keep = torch.from_numpy(np.flatnonzero(s.trainable)).to(dev)
        lp = tree_logprobs(
            self.model, ids, pos, parent, keep, self.options.attention,
            chunk=self.config.logit_chunk, entropy=False, precision=self.config.precision,
        )[0]  # fmt: skip
        return -lp.sum() / normalise

    # ------------------------------------------------------------------ weights and state

    def export_weights(self, directory: str | Path) -> Path:
        """Write the weights as ``model.safetensors`` in ``directory`` (atomically: written
        beside it, then renamed) and return the file's path, for ``TorchEngine.publish``."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        # Cloned so that tied weights become separate tensors (safetensors refuses shares).
        state = {
            k: v.detach().to("cpu").contiguous().clone() for k, v in self.model.state_dict().items()
        }
        tmp = out / f".{WEIGHTS_FILE}.{os.getpid()}.tmp"
        save_file(state, str(tmp), metadata={"gyre_version": str(self.version)})
        os.replace(tmp, out / WEIGHTS_FILE)
        return out / WEIGHTS_FILE

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "config": self.settings(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {"model", "optimizer", "version"} - state.keys()
        if missing:
            raise ValueError(f"trainer state lacks {', '.join(sorted(missing))}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])


def shard_by_tokens(samples: Sequence[PackedSample], width: int) -> list[list[PackedSample]]:
    """``width`` shards with balanced token counts (longest first, onto the lightest shard).
    Deterministic; a shard may be empty when there are fewer samples than shards."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    shards: list[list[PackedSample]] = [[] for _ in range(width)]
    load = [0] * width
    for s in sorted(samples, key=lambda s: -len(s)):
        i = min(range(width), key=lambda j: (load[j], j))
        shards[i].append(s)
        load[i] += len(s)
    return shards


def demo_sample(prompt_ids: Sequence[int], target_ids: Sequence[int]) -> PackedSample:
    """A one-path sample: ``prompt_ids`` as context, ``target_ids`` as the trained tokens."""
    if len(prompt_ids) == 0:
        raise ValueError("a demonstration needs a non-empty prompt (nothing predicts token 0)")
    if len(target_ids) == 0:
        raise ValueError("a demonstration needs at least one target token")
    ids = np.asarray([*prompt_ids, *target_ids], dtype=np.int64)
    n, p = len(ids), len(prompt_ids)
    trainable = np.arange(n) >= p
    return PackedSample(
        group_ids=["demo"],
        group=np.zeros(n, dtype=np.int32),
        input_ids=ids,
        position_ids=np.arange(n, dtype=np.int64),
        parent=np.arange(-1, n - 1, dtype=np.int64),
        trainable=trainable,
        advantage=trainable.astype(np.float64),
        logprob=np.full(n, np.nan),
        version=np.full(n, -1, dtype=np.int64),
    )
