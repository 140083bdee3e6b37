"""The import contract (DESIGN.md, "Boundaries"): which code may import which.

Read from every module's source (its AST), so the check is exact, takes well under a
second and imports neither Django nor Ray. An import inside a function or under
``TYPE_CHECKING`` counts like any other. ``platform/`` is a source folder, not a package
(see test_layout.py): its modules are named from inside it (``gyre_web.runs.services``).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from benchmarks.house import House, imports, sources, survey

ROOT = Path(__file__).resolve().parents[1]

# gyre_core runs from a notebook or the CLI: no web framework, task queue or platform.
CORE_BANNED = ("django", "celery", "channels", "rest_framework", "gyre_web", "workers")

# The gyre_core surface the platform and the workers use, as module names (exact).
SURFACE = {
    "gyre_core.config": "run configs validated at the edge, the form's schema and presets",
    "gyre_core.events": "the run events the platform stores, derives rows from and serves",
    "gyre_core.runtime": "the runtime's entry point: run_job, error_line, Cancelled",
    "gyre_core.trajectory.export": "what the browser shows of a tree (specs, advantages with"
    " the run's own weighting, node tokens) and the rollout file format it reads",
    "gyre_core.data_files": "a dataset upload checked as its kind's readers read it",
}
# Beyond the surface, each with its reason; test_every_exception_is_still_needed removes
# one from here once nothing needs it.
PLATFORM_EXCEPTIONS = {
    # the bounded, strict JSON reader the core's logs use: request bodies and socket frames
    "gyre_core.jsonl": "inputs.py and realtime/consumers.py parse untrusted JSON with it",
    # torch-free: which folders of a run are complete checkpoints
    "gyre_core.train.checkpoint_dirs": "runs/checkpoints.py lists and streams a run's checkpoints",
}
WORKER_EXCEPTIONS = {
    # a module of its own so that importing the entry point does not import Ray
    "gyre_core.runtime.inventory": "tasks.py syncs Ray's nodes and GPUs into the cluster page",
}
# Import circles between gyre_core's packages (its folders and top-level modules) still
# allowed, each a sorted pair of packages that import each other.
KNOWN_CIRCLES: set[tuple[str, str]] = set()  # none left
# What the workers may use of the platform: an app's services, selectors and models.
PLATFORM_LAYERS = ("services", "selectors", "models")


@cache
def modules(root: Path) -> frozenset[str]:
    folders = ("gyre_core", "platform/gyre_web", "workers")
    return frozenset(m for f in folders for _, m, _ in sources(root, f))


def core_violations(root: Path = ROOT) -> list[str]:
    known = modules(root)
    return [
        f"{rel}:{line} imports {name}"
        for rel, module, path in sources(root, "gyre_core")
        for line, name in imports(path, module, known)
        if name.split(".")[0] in CORE_BANNED
    ]


def platform_violations(root: Path = ROOT) -> list[str]:
    known, allowed = modules(root), SURFACE.keys() | PLATFORM_EXCEPTIONS.keys()
    out = []
    for rel, module, path in sources(root, "platform/gyre_web"):
        for line, name in imports(path, module, known):
            top = name.split(".")[0]
            # Celery tasks go out by name through gyre_web.queue: nothing of the workers.
            if (top == "gyre_core" and name not in allowed) or top == "workers":
                out.append(f"{rel}:{line} imports {name}")
    return out


def worker_violations(root: Path = ROOT) -> list[str]:
    known, allowed = modules(root), SURFACE.keys() | WORKER_EXCEPTIONS.keys()
    out = []
    for rel, module, path in sources(root, "workers"):
        for line, name in imports(path, module, known):
            parts = name.split(".")
            if (parts[0] == "gyre_core" and name not in allowed) or (
                parts[0] == "gyre_web" and (len(parts) != 3 or parts[2] not in PLATFORM_LAYERS)
            ):
                out.append(f"{rel}:{line} imports {name}")
    return out


@cache
def house(root: Path) -> House:
    return survey(root)


def core_circles(root: Path = ROOT) -> list[str]:
    """Each circle among gyre_core's packages, with the imports that draw its arrows;
    a circle of exactly one known pair is allowed. An import inside a function counts."""
    drawn, out = house(root), []
    for circle in drawn.circles():
        if len(circle) == 2 and tuple(circle) in KNOWN_CIRCLES:
            continue
        arrows = [
            f"  {a} -> {b}: {by[0]}" for (a, b), by in sorted(drawn.arrows.items())
            if a in circle and b in circle
        ]  # fmt: skip
        out.append(" <-> ".join(circle) + "\n" + "\n".join(arrows))
    return out


def test_gyre_core_packages_import_in_no_circle():
    assert not (bad := core_circles()), "import circles:\n" + "\n".join(bad)


def test_every_known_circle_is_still_there():
    assert {tuple(c) for c in house(ROOT).circles()} >= KNOWN_CIRCLES, "no longer a circle"


def test_gyre_core_imports_no_web_framework_task_queue_or_platform():
    assert not (bad := core_violations()), "gyre_core crosses its boundary:\n" + "\n".join(bad)


def test_platform_imports_only_the_core_surface_and_no_workers():
    assert not (bad := platform_violations()), "outside the surface:\n" + "\n".join(bad)


def test_workers_import_the_entry_point_and_platform_services():
    assert not (bad := worker_violations()), "outside the surface:\n" + "\n".join(bad)


def test_every_listed_module_exists_and_every_exception_is_still_needed():
    known = modules(ROOT)
    listed = SURFACE.keys() | PLATFORM_EXCEPTIONS.keys() | WORKER_EXCEPTIONS.keys()
    assert not listed - known, "no such module"

    def imported(folder: str) -> set[tuple[str, str]]:
        return {
            (rel, name)
            for rel, module, path in sources(ROOT, folder)
            for _, name in imports(path, module, known)
        }

    platform, workers = imported("platform/gyre_web"), imported("workers")
    assert not PLATFORM_EXCEPTIONS.keys() - {name for _, name in platform}, "no longer used"
    assert not WORKER_EXCEPTIONS.keys() - {name for _, name in workers}, "no longer used"


def test_a_crossing_is_named_by_file_line_and_import(tmp_path):
    """The crossings issue 27 found, written again, are each caught and named."""
    files = {
        "gyre_core/runtime/leak.py": "def f():\n    from gyre_web.runs import services\n",
        "gyre_core/events.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    import django.db\n",
        "platform/gyre_web/cluster/services.py": "from workers.wake import Waker\n",
        "platform/gyre_web/runs/views.py": "from gyre_core.runtime.calibrate import predict\n"
        "from gyre_core import events\n",
        "workers/sink.py": "from gyre_web.runs.consumers import group_name\n"
        "from gyre_core.runtime.loop import Loop\n",
        "workers/tasks.py": "from gyre_web.runs import services\nfrom gyre_core.runtime import run_job\n",
        # issue 42's circle, short: config -> rollout -> runtime -> config, one import lazy
        "gyre_core/config.py": "from gyre_core.rollout.engine import ENGINES\n",
        "gyre_core/rollout/engine.py": "def f():\n    from gyre_core.runtime.vllm_unit import U\n",
        "gyre_core/runtime/vllm_unit.py": "from gyre_core.config import ConfigError\n",
        "gyre_core/train/config.py": "from gyre_core.config import RunConfig\n",
        "gyre_core/trajectory/export.py": "from gyre_core.config import RunConfig\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "platform/gyre_web/runs/services.py").write_text("")
    assert core_violations(tmp_path) == [
        "gyre_core/events.py:3 imports django.db",
        "gyre_core/runtime/leak.py:2 imports gyre_web.runs.services",
    ]
    assert platform_violations(tmp_path) == [
        "platform/gyre_web/cluster/services.py:1 imports workers.wake",
        "platform/gyre_web/runs/views.py:1 imports gyre_core.runtime.calibrate",
    ]
    assert worker_violations(tmp_path) == [
        "workers/sink.py:1 imports gyre_web.runs.consumers",
        "workers/sink.py:2 imports gyre_core.runtime.loop",
    ]
    assert core_circles(tmp_path) == [
        "config <-> rollout <-> runtime\n"
        "  config -> rollout: gyre_core/config.py:1 imports gyre_core.rollout.engine\n"
        "  rollout -> runtime: gyre_core/rollout/engine.py:2 imports gyre_core.runtime.vllm_unit\n"
        "  runtime -> config: gyre_core/runtime/vllm_unit.py:1 imports gyre_core.config"
    ]


def test_the_house_tool_draws_floors_arrows_back_up_and_long_functions(tmp_path):
    """benchmarks/house.py on a small tree: a circle of two packages gives one arrow back
    up; a platform import of the workers and a 90-line function are each listed."""
    body = "\n".join(f"    x{i} = {i}" for i in range(89))
    files = {
        "gyre_core/errors.py": "",
        "gyre_core/config.py": "from gyre_core.errors import E\nfrom gyre_core.train import t\n",
        "gyre_core/train/__init__.py": "",
        "gyre_core/train/t.py": f"def f():\n    from gyre_core.config import C\n{body}\n",
        "gyre_core/cli/main.py": "import gyre_core.config\n",
        "platform/gyre_web/runs/services.py": "from workers.celery_app import app\n",
        "workers/celery_app.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    report = survey(tmp_path).report()
    assert report["circles"] == [["config", "train"]]
    assert report["floors"] == 3  # whichever way the circle is cut
    assert [a["arrow"] for a in report["arrows_back_up"]] in (
        ["config -> train"],
        ["train -> config"],
    )
    assert report["platform_to_workers"] == [
        "platform/gyre_web/runs/services.py:1 imports workers.celery_app"
    ]
    assert report["functions_over_80"] == ["gyre_core/train/t.py:1 f (91)"]
