"""Metric rollups, the pure part: blocks of ``2**level`` steps with their min, max and last
value, and the step grid a downsampled request is answered on. No queries here except in
``rebuild``, which takes the model classes so that a migration can hand it its own.

The grid. A request for ``points`` buckets over the steps ``lo..hi`` gets buckets of
``width = ceil(span / points)`` steps starting at ``lo`` (the points themselves are grouped)
when the span is at most RAW_SPAN steps or the buckets are narrower than 2 * PER_BUCKET
steps. Otherwise it is answered from the blocks of the largest level whose blocks fit
PER_BUCKET times in a bucket: the grid then starts at ``lo`` rounded down to a block edge
and ``width`` is rounded up to whole blocks (so at most ``points`` buckets, and at least
about 4/5 of what the plain width would give), and every bucket is a union of whole blocks:
its min, max and last are exactly those of the points in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

LEVELS = 16  # blocks of 2, 4, ..., 65,536 steps; the top level also serves as a summary
RAW_SPAN = 4096  # a request over at most this many steps groups the points themselves
PER_BUCKET = 4  # blocks per bucket at least: 4..8 rows read per bucket returned


@dataclass(frozen=True)
class Grid:
    origin: int  # the first bucket's first step
    width: int  # steps per bucket
    level: int  # 0: group the points; else the rollup level read


def plain_grid(lo: int, hi: int, points: int) -> Grid:
    """Buckets of ``ceil(span / points)`` steps from ``lo``, grouped from the points."""
    return Grid(lo, max(1, math.ceil((hi - lo + 1) / points)), 0)


def grid(lo: int, hi: int, points: int) -> Grid:
    plain = plain_grid(lo, hi, points)
    width = plain.width
    if hi - lo + 1 <= RAW_SPAN or width < 2 * PER_BUCKET:
        return plain
    level = min(LEVELS, (width // PER_BUCKET).bit_length() - 1)
    size = 1 << level
    origin = (lo // size) * size
    width = -(-width // size) * size
    while -(-(hi - origin + 1) // width) > points:  # rounding lo down may add a bucket
        width += size
    return Grid(origin, width, level)


@dataclass
class Block:
    min: float
    max: float
    last: float
    first_step: int
    last_step: int
    count: int

    def merge(self, other: Block) -> None:
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        if other.last_step > self.last_step:
            self.last, self.last_step = other.last, other.last_step
        self.first_step = min(self.first_step, other.first_step)
        self.count += other.count


Key = tuple[str, int, int]  # (name, level, bucket)


def blocks(points: Iterable[tuple[str, int, float]]) -> dict[Key, Block]:
    """Every level's blocks of ``points`` (name, step, value), each step at most once:
    level 1 from the points, each level above from the one below."""
    out: dict[Key, Block] = {}
    below: dict[tuple[str, int], Block] = {}
    for name, step, value in points:
        block = Block(value, value, value, step, step, 1)
        key = (name, step >> 1)
        if key in below:
            below[key].merge(block)
        else:
            below[key] = block
    for level in range(1, LEVELS + 1):
        out.update({(name, level, bucket): b for (name, bucket), b in below.items()})
        if level == LEVELS:
            break
        above: dict[tuple[str, int], Block] = {}
        for (name, bucket), b in below.items():
            key = (name, bucket >> 1)
            if key in above:
                above[key].merge(b)
            else:
                above[key] = Block(b.min, b.max, b.last, b.first_step, b.last_step, b.count)
        below = above
    return out


FIELDS = ["min", "max", "last", "first_step", "last_step", "count"]


def row_fields(block: Block) -> dict[str, Any]:
    return {
        "min": block.min,
        "max": block.max,
        "last": block.last,
        "first_step": block.first_step,
        "last_step": block.last_step,
        "count": block.count,
    }


def rebuild(point_model: Any, rollup_model: Any, run_ids: Iterable[int] | None = None) -> int:
    """Recompute the rollups of ``run_ids`` (all runs: None) from their points; -> rows."""
    points = point_model.objects.all()
    if run_ids is not None:
        points = points.filter(run_id__in=list(run_ids))
    written = 0
    for run_id in sorted(set(points.values_list("run_id", flat=True).distinct())):
        rollup_model.objects.filter(run_id=run_id).delete()
        rows = point_model.objects.filter(run_id=run_id).values_list("name", "step", "value")
        built = blocks(rows.iterator(chunk_size=20_000))
        rollup_model.objects.bulk_create(
            [
                rollup_model(run_id=run_id, name=n, level=lv, bucket=bk, **row_fields(b))
                for (n, lv, bk), b in built.items()
            ],
            batch_size=5000,
        )
        written += len(built)
    return written
