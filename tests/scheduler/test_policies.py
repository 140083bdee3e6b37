"""The policies as pure functions: snapshot in, decision out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gyre_core.cluster import ROLLOUT, SWITCHING, TRAIN, Cluster, ClusterError
from gyre_core.config import RunConfig, config_schema
from gyre_core.scheduler.base import Snapshot
from gyre_core.scheduler.policies import (
    POLICIES,
    Async,
    Colocate,
    Elastic,
    fixed_split_policies,
    make_policy,
    policy_for,
    register_policy,
)

B = 8


def snap(roles: list[str], **kw: object) -> Snapshot:
    base = Snapshot(
        t=0.0, roles=tuple(roles), targets=tuple(roles), loads=tuple(0 for _ in roles),
        affinity=tuple(0 for _ in roles),
        queued_calls=0, active_sessions=0, calls_in_flight=0, ready=0, ready_tokens=0,
        started=0, remaining=64, version=0, steps_total=8, training=False,
        rollouts_per_step=B, staleness=1, max_seqs_per_unit=4, switch_s=30.0, train_tok_s=1000.0,
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def test_admission_respects_the_staleness_bound() -> None:
    s = snap([ROLLOUT] * 3 + [TRAIN])
    assert s.admissible == (0 + 1 + 1) * B  # versions 0 and 1 may be in flight
    assert Async(3, 1).decide(replace(s, started=12)).admit == 4
    assert Async(3, 1).decide(replace(s, started=16, version=1)).admit == 8
    assert Async(3, 1).decide(replace(s, started=60, remaining=4, version=6)).admit == 4


def test_admission_has_its_own_bound_and_a_cap_that_every_policy_obeys() -> None:
    s = snap([ROLLOUT] * 3 + [TRAIN], admit_staleness=3)
    assert s.admissible == (0 + 3 + 1) * B  # the masking bound (staleness 1) is apart
    assert snap([ROLLOUT] * 4, admit_staleness=0).admissible == B
    capped = replace(s, max_active=10, active_sessions=6, started=6, remaining=58)
    assert capped.admissible == 4
    assert Async(3, 1).decide(capped).admit == 4
    assert Elastic().decide(capped).admit == 4
    assert replace(capped, active_sessions=12).admissible == 0  # over the cap: none
    col, roles = Colocate(), [ROLLOUT] * 4  # the step's own rollouts, the cap at once
    assert col.decide(snap(roles, max_active=5)).admit == 5
    assert col.decide(snap(roles, max_active=5, active_sessions=5, started=5)).admit == 0
    assert col.decide(snap(roles, max_active=5, active_sessions=2, started=5, ready=3)).admit == 3
    assert col.decide(snap(roles, max_active=5, active_sessions=2, started=8, ready=6)).admit == 0


def test_boundary_dispatch_releases_bursts_for_every_policy() -> None:
    """Under boundary dispatch nothing starts while a rollout of the last burst runs, and a
    burst is at most ``burst_steps`` batches (within admission and the cap)."""
    s = snap([ROLLOUT] * 3 + [TRAIN], burst_steps=1, staleness=2)
    assert s.admissible == B  # continuous would admit 3 batches (staleness 2)
    assert replace(s, active_sessions=1, started=8).admissible == 0  # the burst runs
    assert replace(s, started=8, version=0, ready=8).admissible == B  # it ended: next
    two = replace(s, burst_steps=2)
    assert two.admissible == 2 * B
    assert replace(two, started=16).admissible == 0  # admission allows one batch: wait
    assert replace(two, started=16, version=1, ready=8).admissible == 2 * B  # whole burst
    assert replace(two, max_active=5).admissible == 5
    assert replace(two, burst_steps=5).admissible == 3 * B  # no further than admission
    for pol in (Async(3, 1), Elastic()):
        assert pol.decide(replace(s, active_sessions=2, started=8)).admit == 0
        assert pol.decide(two).admit == 2 * B
    col = Colocate()  # a burst of k batches, trained one step after another
    assert col.decide(snap([ROLLOUT] * 4, burst_steps=3, staleness=2)).admit == 3 * B
    assert col.decide(snap([ROLLOUT] * 4, burst_steps=4, staleness=2)).admit == 3 * B  # bound
    assert col.decide(snap([ROLLOUT] * 4, burst_steps=0)).admit == B
    assert col.decide(snap([TRAIN] * 4, burst_steps=3, version=1, ready=2 * B)).start_step
    cfg = RunConfig.from_dict({"scheduler": {"dispatch": "boundary", "burst_steps": 4}})
    assert cfg.scheduler.bursts == 4 and RunConfig().scheduler.bursts == 0


def test_colocate_cycles_generate_train_generate() -> None:
    pol, roles = Colocate(), [ROLLOUT] * 4
    assert pol.decide(snap(roles)).admit == B  # one batch at a time
    assert pol.decide(snap(roles, active_sessions=3, started=8, remaining=56)).admit == 0
    done = pol.decide(snap(roles, ready=B, started=8, remaining=56))
    assert done.targets == {0: TRAIN, 1: TRAIN, 2: TRAIN, 3: TRAIN} and not done.start_step
    assert pol.decide(snap([TRAIN] * 4, ready=B)).start_step
    back = pol.decide(snap([TRAIN] * 4, version=1, started=8, remaining=56))
    assert back.targets == {u: ROLLOUT for u in range(4)} and back.admit == 0


def test_async_keeps_its_split_and_trains_when_a_batch_is_ready() -> None:
    pol = Async(3, 1)
    assert pol.initial_roles(4) == [ROLLOUT] * 3 + [TRAIN]
    d = pol.decide(snap([ROLLOUT] * 3 + [TRAIN], ready=B))
    assert d.start_step and not d.targets
    assert not pol.decide(snap([ROLLOUT] * 3 + [TRAIN], ready=B, training=True)).start_step
    with pytest.raises(ValueError, match="does not add up") as err:
        Async(2, 1).initial_roles(4)
    assert "rollout_units 2" in str(err.value) and "--split" not in str(err.value)


def test_the_scheduler_section_configures_the_policy() -> None:
    knobs = {"elastic_fill": 0.7, "elastic_train_share": 1.0, "elastic_return_below": 0.2}
    pol = policy_for(RunConfig.from_dict({"scheduler": knobs}).scheduler, 4)
    assert pol == Elastic(fill=0.7, train_share=1.0, return_below=0.2)
    assert policy_for(RunConfig().scheduler, 4) == Elastic()  # the defaults are today's
    assert pol.initial_roles(4) == [TRAIN] * 3 + [ROLLOUT]  # one unit always serves
    cfg = RunConfig.from_dict({"scheduler": {"policy": "async", "rollout_units": 5}})
    assert policy_for(cfg.scheduler, 6) == Async(5, 1)
    assert policy_for(replace(cfg.scheduler, rollout_units=0), 6) == Async(3, 3)  # half


def test_elastic_moves_spare_engines_to_training_lightest_first() -> None:
    pol = Elastic()
    roles = [ROLLOUT] * 4
    # 5 sessions need ceil(5 / (4 * 0.5)) = 3 engines, the base share is 2 of 4 units: a
    # batch is ready, so the 2 lightest engines go to train.
    s = snap(roles, ready=B, active_sessions=5, loads=(3, 0, 2, 0), started=13, remaining=51)
    d = pol.decide(s)
    assert d.targets == {3: TRAIN, 1: TRAIN}
    assert not d.start_step  # no unit is in the train role yet


def test_elastic_waits_for_switching_units_only_when_it_pays() -> None:
    pol = Elastic()
    roles = [TRAIN, SWITCHING, SWITCHING, ROLLOUT]
    targets = (TRAIN, TRAIN, TRAIN, ROLLOUT)
    # 8,000 tokens: alone 8 s; with 3 units 30 s + 2.7 s. Start now.
    s = snap(roles, targets=targets, ready=B, ready_tokens=8_000, started=8, remaining=56)
    assert pol.decide(s).start_step
    # 800,000 tokens: alone 800 s; waiting 30 s for 3 units: 297 s. Wait.
    assert not pol.decide(replace(s, ready_tokens=800_000)).start_step


def test_elastic_returns_units_when_the_next_batch_is_far() -> None:
    pol = Elastic(fill=0.5)
    roles = [TRAIN, TRAIN, TRAIN, ROLLOUT]
    # 16 sessions want 8 engines at half fill; rollout has 1. The base share (half of 4
    # units) stays in training; the third training unit goes back.
    s = snap(roles, ready=1, active_sessions=16, started=24, remaining=40, version=2)
    assert pol.decide(s).targets == {2: ROLLOUT}
    # 6 of 8 ready and the sessions fit the one engine's cap: keep the trainer.
    near = replace(s, ready=6, active_sessions=4, started=32, remaining=32)
    assert pol.decide(near).targets == {}


def test_elastic_never_lets_sessions_queue_for_an_engine() -> None:
    pol = Elastic()
    roles = [TRAIN, TRAIN, TRAIN, ROLLOUT]
    # 16 sessions overflow one engine's cap of 4: whatever the backlog, the training
    # units not inside a step come back, all but one.
    s = snap(roles, ready=6, active_sessions=16, started=24, remaining=40, version=2)
    assert pol.decide(s).targets == {0: ROLLOUT, 1: ROLLOUT}
    assert pol.decide(replace(s, training=True)).targets == {}  # a step keeps its units
    full = replace(s, ready=B)  # a batch is ready: it trains first
    assert all(r == TRAIN for r in pol.decide(full).targets.values())


def test_elastic_keeps_engines_for_the_sessions_the_backlog_will_admit() -> None:
    pol = Elastic(fill=0.5)
    roles = [ROLLOUT] * 6 + [TRAIN] * 2
    # Admission is closed (staleness 1, version 0: 16 started); 2 sessions live and 16
    # rollouts ready. Counting only the 2 live sessions, 7 engines would be spare; the
    # two steps waiting will admit 16 more sessions, which need 16 / 2 = 8 engines at
    # half fill: nothing beyond the base share (4 units) is harvested.
    s = snap(roles, ready=16, active_sessions=2, started=16, remaining=48, version=0)
    assert s.admissible == 0
    moved = pol.decide(s).targets
    assert sorted(moved.values()) == [TRAIN, TRAIN]  # the base share: 2 + 2 = 4


def test_registry_and_clusters() -> None:
    assert make_policy("async", 8).initial_roles(8) == [ROLLOUT] * 4 + [TRAIN] * 4
    with pytest.raises(ValueError, match="unknown policy 'greedy'; expected one of colocate"):
        make_policy("greedy", 8)
    assert list(POLICIES) == config_schema()["scheduler.policy"]["choices"]  # one list
    with pytest.raises(ValueError, match="already registered"):
        register_policy("elastic")(lambda units, cfg: Elastic())
    assert Cluster(1000, 8).counts()["idle"] == 125
    with pytest.raises(ClusterError, match="do not divide"):
        Cluster(12, 8)


def test_a_split_goes_to_the_policies_that_keep_one() -> None:
    assert fixed_split_policies() == ["async"]
    assert make_policy("async", 8, (3, 5)) == Async(3, 5)
    assert isinstance(make_policy("elastic", 8, (3, 5)), Elastic)  # no split of its own
    assert isinstance(make_policy("colocate", 8, (3, 5)), Colocate)


def test_elastic_harvests_engines_only_before_a_step() -> None:
    pol = Elastic()
    roles = [ROLLOUT] * 6 + [TRAIN] * 2
    # Admission closed, a batch ready, 2 sessions live: before a step the spare engines
    # go to training (the next step trains on them) ...
    s = snap(roles, ready=B, active_sessions=2, started=16, remaining=48, version=0)
    assert s.admissible == 0
    assert TRAIN in pol.decide(s).targets.values()
    # ... but while a step runs a harvested engine would only wait for the next one.
    assert TRAIN not in pol.decide(replace(s, training=True)).targets.values()
