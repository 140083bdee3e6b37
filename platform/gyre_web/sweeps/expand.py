"""A sweep's parameter spec expanded into the values of each run (no Django here).

grid: ``{"train.lr": [1e-4, 3e-4], "seed": [0, 1]}`` -> every combination, the first field
varying slowest. random: each field a list of choices or a range ``{"low", "high"}`` (with
``"log": true`` drawn log-uniformly, with ``"int": true`` an integer), ``samples`` draws
from ``random.Random(seed)``. A bad spec raises SpecInvalid naming the field."""

from __future__ import annotations

import itertools
import math
import random
import re
from typing import Any

MAX_RUNS = 64
MAX_FIELDS = 8
_PATH = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*){0,3}")


class SpecInvalid(ValueError):
    """``errors``: [(field, message)], the field as the API names it (``params["x.y"]``)."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {m}" for f, m in errors))
        self.errors = errors


def param_key(path: str) -> str:
    return f'params["{path}"]'


def _scalar(v: Any) -> bool:
    return (
        v is None or isinstance(v, str | bool | int) or (isinstance(v, float) and math.isfinite(v))
    )


def _check_paths(params: Any) -> list[tuple[str, str]]:
    if not isinstance(params, dict) or not params:
        return [("params", "an object of field path -> values, with at least one field")]
    if len(params) > MAX_FIELDS:
        return [("params", f"at most {MAX_FIELDS} fields")]
    return [
        (param_key(str(p)), "a config field path such as train.lr")
        for p in params
        if not _PATH.fullmatch(str(p))
    ]


def _choices(path: str, values: Any) -> list[tuple[str, str]]:
    if not isinstance(values, list) or not values:
        return [(param_key(path), "a non-empty list of values")]
    if len(values) > MAX_RUNS or not all(_scalar(v) for v in values):
        return [(param_key(path), f"at most {MAX_RUNS} values, each a number, string or bool")]
    return []


def _range(path: str, spec: dict[str, Any]) -> list[tuple[str, str]]:
    lo, hi = spec.get("low"), spec.get("high")
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (lo, hi))
    extra = set(spec) - {"low", "high", "log", "int"}
    if not numbers or extra or not math.isfinite(lo) or not math.isfinite(hi):  # type: ignore[arg-type]
        return [(param_key(path), 'a range {"low": number, "high": number, "log"?, "int"?}')]
    if lo > hi:  # type: ignore[operator]
        return [(param_key(path), "low must not be above high")]
    if spec.get("log") and lo <= 0:  # type: ignore[operator]
        return [(param_key(path), "a log range needs low above 0")]
    return []


def grid(params: Any) -> list[dict[str, Any]]:
    errors = _check_paths(params)
    if not errors:
        for path, values in params.items():
            errors += _choices(path, values)
    if errors:
        raise SpecInvalid(errors)
    total = math.prod(len(v) for v in params.values())
    if total > MAX_RUNS:
        raise SpecInvalid([("params", f"the grid has {total} runs; at most {MAX_RUNS}")])
    paths = list(params)
    return [dict(zip(paths, combo, strict=True)) for combo in itertools.product(*params.values())]


def _draw(rng: random.Random, spec: Any) -> Any:
    if isinstance(spec, list):
        return spec[rng.randrange(len(spec))]
    lo, hi = spec["low"], spec["high"]
    if spec.get("log"):
        value = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    else:
        value = rng.uniform(lo, hi)
    return round(value) if spec.get("int") else value


def random_samples(params: Any, samples: int, seed: int) -> list[dict[str, Any]]:
    errors = _check_paths(params)
    if not errors:
        for path, spec in params.items():
            errors += _range(path, spec) if isinstance(spec, dict) else _choices(path, spec)
    if not 1 <= samples <= MAX_RUNS:
        errors.append(("samples", f"between 1 and {MAX_RUNS}"))
    if errors:
        raise SpecInvalid(errors)
    rng = random.Random(seed)
    return [{path: _draw(rng, spec) for path, spec in params.items()} for _ in range(samples)]


def nested(path: str, value: Any) -> dict[str, Any]:
    """``"train.lr", 3e-4`` -> ``{"train": {"lr": 3e-4}}``."""
    out: dict[str, Any] = {}
    node = out
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out
