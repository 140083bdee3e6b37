"""Which finished rollouts a training step takes: shared by the simulator and the runtime.

* ``arrival`` (the default): a step never waits for a straggler while others are done
  (AReaL's and verl's fully-async trainers batch this way). With group-relative rewards
  (``group_size`` > 1; rollout ``i`` is in group ``i // group_size``) a step takes only
  *complete* groups, every member finished (a failed rollout is a finished member): the
  ready groups whose oldest token was decoded by the oldest policy version first, ties by
  the finish of the group's last member, until ``per_step`` rollouts; a group's late
  members make it wait for a later step. A complete group whose every token is older than
  the staleness bound at the step (version ``v < step - staleness``: the loss would mask
  all of it) is dropped: never trained, returned as :attr:`Selection.stale` for its
  caller to count. Without groups (``group_size`` 1) it is the first ``per_step``
  rollouts to finish, whatever step admitted them, and nothing is dropped (the trainer
  masks stale tokens).
* ``index``: step ``k`` trains exactly rollouts ``k*per_step .. (k+1)*per_step - 1``, the
  tasks, groups and sampling seeds colocate would give it, and waits for the slowest of
  them. Two runs then differ only in which policy version produced each token, so async
  and elastic runs repeat far closer (docs/learning.md). ``per_step`` is whole groups, so
  it never splits one; it drops nothing.

Both orders train every rollout they do not drop exactly once; only the grouping into
steps differs. A rollout's versions are its ``Span``: the oldest and the newest policy
version among its decoded tokens (``None``: it decoded none, as a rollout that failed
before its first call; a group of such rollouts is never stale, and ranks as the step's
own version).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

ARRIVAL, INDEX = "arrival", "index"
ORDERS = (ARRIVAL, INDEX)

Span = tuple[int, int] | None  # a rollout's oldest and newest token version (None: no token)


@dataclass(frozen=True, slots=True)
class Groups:
    """What ``arrival`` needs to take whole groups: their size (1: no groups), the ready
    rollouts' :data:`Span` (one per entry of ``ready``; ``None``: versions unknown, the
    groups rank by finish alone) and the staleness bound (``None``: drop nothing)."""

    size: int = 1
    spans: Sequence[Span] | None = None
    staleness: int | None = None


NO_GROUPS = Groups()


@dataclass(frozen=True, slots=True)
class Selection:
    """Positions in ``ready``: ``usable`` in the order steps will train them (its first
    ``per_step`` are the next step's batch once there are that many), ``stale`` those of
    complete groups past the staleness bound, which no step will train."""

    usable: list[int]
    stale: list[int] = field(default_factory=list)


def select(
    ready: Sequence[int],
    per_step: int,
    step: int,
    order: str,
    groups: Groups = NO_GROUPS,
) -> Selection:
    """Which of ``ready`` (rollout indices, in finish order) steps will train, from step
    ``step`` (the number of steps already taken, the version the next one trains) on.
    ``groups`` matters only to ``arrival`` (see the module docstring).

    ``len(result.usable) >= per_step`` exactly when the next step can start.
    """
    if order not in ORDERS:
        raise ValueError(f"batch order must be one of {', '.join(ORDERS)}, got {order!r}")
    if order == INDEX:
        return Selection(_by_index(ready, per_step, step))
    if groups.size == 1:
        return Selection(list(range(len(ready))))
    if groups.size < 1 or per_step % groups.size:
        raise ValueError(
            f"a step of {per_step} rollouts is not whole groups of {groups.size}: "
            "arrival batching would split a group"
        )
    return _by_group(ready, step, groups)


def _by_index(ready: Sequence[int], per_step: int, step: int) -> list[int]:
    """The ready members of step ``step``'s batch, then, only if that batch is complete,
    those of the next, and so on."""
    by_step: dict[int, list[int]] = {}
    for pos, idx in enumerate(ready):
        by_step.setdefault(idx // per_step, []).append(pos)
    out: list[int] = []
    k = step
    while members := sorted(by_step.get(k, []), key=lambda p: ready[p]):
        out += members
        if len(members) < per_step:
            break
        k += 1
    return out


@dataclass(frozen=True, slots=True)
class Complete:
    """A group every member of which finished: its number (``index // size``), the
    :data:`Span` of its members' tokens together and when its last member finished (a
    count that grows with finish order)."""

    number: int
    span: Span
    last: int


def merge(spans: Iterable[Span]) -> Span:
    """The span of several rollouts' tokens together (None: none of them has a token)."""
    known = [s for s in spans if s is not None]
    return (min(s[0] for s in known), max(s[1] for s in known)) if known else None


def rank(
    complete: Iterable[Complete], step: int, staleness: int | None
) -> tuple[list[Complete], list[Complete]]:
    """Complete groups in the order steps from ``step`` on train them (the oldest token
    version first, ties by the finish of the last member; a group without tokens ranks as
    ``step``), and those every token of which is past ``staleness`` (never trained)."""
    ranked: list[Complete] = []
    stale: list[Complete] = []
    for g in complete:
        past = staleness is not None and g.span is not None and g.span[1] < step - staleness
        (stale if past else ranked).append(g)
    ranked.sort(key=lambda g: (g.span[0] if g.span is not None else step, g.last))
    return ranked, stale


def _by_group(ready: Sequence[int], step: int, groups: Groups) -> Selection:
    members_of: dict[int, list[int]] = {}
    for pos, idx in enumerate(ready):
        members_of.setdefault(idx // groups.size, []).append(pos)
    spans = groups.spans
    complete = [
        Complete(g, merge(spans[p] for p in members) if spans else None, max(members))
        for g, members in members_of.items()
        if len(members) == groups.size  # else a member still runs: the group waits
    ]
    ranked, stale = rank(complete, step, groups.staleness)

    def positions(gs: list[Complete]) -> list[int]:
        return [p for g in gs for p in sorted(members_of[g.number], key=lambda p: ready[p])]

    return Selection(positions(ranked), sorted(positions(stale)))


def usable(
    ready: Sequence[int], per_step: int, step: int, order: str, groups: Groups = NO_GROUPS
) -> list[int]:
    """Positions in ``ready`` in the order steps will train them (:func:`select`)."""
    return select(ready, per_step, step, order, groups).usable


def take(
    ready: Sequence[int], per_step: int, step: int, order: str, groups: Groups = NO_GROUPS
) -> list[int] | None:
    """Positions in ``ready`` of the next step's batch, or None while it is incomplete."""
    order_ = usable(ready, per_step, step, order, groups)
    return order_[:per_step] if len(order_) >= per_step else None
