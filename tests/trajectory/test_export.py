"""gyre_core.trajectory.export: node specs of a weighed tree, their path keys leading back
to the same nodes, and a run's weighting read from its config as its trainer reads it."""

from __future__ import annotations

import numpy as np
import pytest

from gyre_core.config import RunConfig, run_weighting
from gyre_core.trajectory.export import (
    export_group,
    node_at,
    node_tokens,
    path_key,
)
from gyre_core.trajectory.rewards import Weighting
from gyre_core.trajectory.synth import PRESETS, synth_rollouts

ONCE = Weighting("once", normalise_std=False)  # the train section's defaults

ROLLOUTS = list(synth_rollouts(PRESETS["tiny"]))  # every kind of call, retries included


def _leaves(node) -> int:
    return sum(_leaves(c) for c in node.children.values()) if node.children else 1


@pytest.mark.parametrize("weighting", [ONCE, Weighting("per_path", normalise_std=True)])
def test_specs_are_the_weighed_tree_in_preorder_and_keys_find_their_nodes(weighting):
    group = ROLLOUTS[0].group_id
    out = export_group(ROLLOUTS, group, weighting, decode=None)
    assert out is not None and out.rollouts == PRESETS["tiny"].group_size
    nodes = list(out.tree.nodes())
    assert len(out.nodes) == len(nodes) and out.tokens_unique == sum(len(n) for n in nodes)
    assert {s["kind"] for s in out.nodes} > {"continue"}  # branches of other kinds are named
    for spec in out.nodes:
        if spec["parent"] is not None:
            parent = out.nodes[spec["parent"]]
            assert spec["parent"] < spec["id"] and spec["path_key"].startswith(parent["path_key"])
            assert spec["depth"] == parent["depth"] + 1
        node = node_at(out.tree, spec["path_key"])
        assert node is not None and (node.start, node.end) == (
            spec["token_start"],
            spec["token_end"],
        )
        assert spec["leaves"] == _leaves(node) and spec["trainable"] == int(node.generated.sum())
        got = node_tokens(out.tree, spec["path_key"], (node.start, node.end), limit=3)
        assert got is not None and got["truncated"] == (len(node) > 3) and len(got["ids"]) <= 3
        gen = node.generated
        want = round(float(np.mean(node.weight[gen])), 6) if gen.any() else None
        assert spec["advantage"] == got["advantage"] == want
    keys = [s["path_key"] for s in out.nodes]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)  # preorder = key order
    tree = weighting.trees(ROLLOUTS)[group]  # what a trainer with this weighting trains on
    assert [list(n.weight) for n in tree.nodes()] == [list(n.weight) for n in nodes]


def test_a_key_or_span_the_tree_lacks_finds_nothing():
    out = export_group(ROLLOUTS, ROLLOUTS[0].group_id, ONCE, decode=None)
    assert out is not None and export_group(ROLLOUTS, "no-such-group", ONCE, None) is None
    first = out.nodes[0]
    assert node_at(out.tree, path_key([10_000])) is None and node_at(out.tree, "") is None
    assert node_at(out.tree, "zz!") is None
    span = (first["token_start"], first["token_end"] + 1)
    assert node_tokens(out.tree, first["path_key"], span, limit=10) is None


def test_a_runs_weighting_is_read_from_its_train_section_with_its_defaults():
    assert run_weighting({}) == ONCE == run_weighting(RunConfig().to_dict())
    cfg = RunConfig.from_dict({"train": {"advantage_mode": "per_path", "normalise_std": True}})
    assert run_weighting(cfg.to_dict()) == Weighting("per_path", normalise_std=True)
    with pytest.raises(ValueError, match=r"train\.advantage_mode: must be one of once, per_path"):
        run_weighting({"train": {"advantage_mode": "sum"}})
