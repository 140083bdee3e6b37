"""A long-horizon "build a repository from a specification" task suite (in the spirit of
NL2RepoBench), small enough for a tiny model to learn on CPU.

A task (:class:`TaskSpec`) lists components: files in an in-memory virtual repository, each
with keys that must be written in spec order with given values. Building one component takes
several tool calls::

    create_file app/db.py
    write app/db.py url sqlite-42
    write app/db.py pool size-7
    run_check db
    fix db            # only after a transient check failure (hidden "flaky" components)
    run_check db

Hidden checks score ``progress`` in [0, 1]: the share of components whose file holds exactly
the spec's keys, in order, with the spec's values, and whose latest ``run_check`` passed
(a later write makes that check stale). :class:`RepoEnv` parses one line of text per step and
never raises on bad input; it returns an error observation instead. Each observation carries a
heavy-tailed simulated tool latency for schedulers and harnesses to use.

Splits: ``load_suite("train" | "benchmark" | "heldout", n, seed)``. ``train`` and
``benchmark`` draw component names, keys and values from disjoint vocabularies (a test of
generalisation to unseen words); ``heldout`` draws *unseen tasks* from the train vocabulary
(its own random stream: new combinations of names, keys, values and numbers), the held-out
split a small model can be scored on after a few minutes of training.

``hints=True`` (a :class:`RepoEnv` option) ends the prompt and every observation with a
status line, the "status bar" of an agent UI: ``focus: <path> <state>`` for the first
component whose file is not fully written (state ``missing``, no file yet, or ``<key>
<value>``, the next key to write and its value), preceded by ``untested: <name> | `` for the
latest component fully written whose check has not passed. It says what is
left, not what to do next: the agent still chooses the tool (create, write, check, fix after
a crashed check, submit) -- whether to check a component as soon as it is written is its
own call -- and copies the arguments exactly.

``scripted_actions`` is an oracle agent reaching progress 1.0; ``random_actions`` is an
untrained baseline that scores near 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

Split = Literal["train", "benchmark", "heldout"]
SPLITS: tuple[Split, ...] = ("train", "benchmark", "heldout")
Size = Literal["short", "medium", "long"]
SIZES: tuple[Size, ...] = ("short", "medium", "long")
TOOLS: tuple[str, ...] = ("create_file", "write", "run_check", "fix", "submit")

# (components lo, hi), (keys per component lo, hi)
_SIZE_SHAPE: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "short": ((3, 3), (2, 3)),
    "medium": ((4, 6), (2, 4)),
    "long": ((10, 14), (3, 5)),  # >= 50 oracle calls
}
_FLAKY_P = 0.25
_EXT = {"module": "py", "config": "toml", "schema": "json"}

_VOCAB: dict[str, dict[str, tuple[str, ...]]] = {
    "train": {
        "package": ("app", "core", "service", "lib"),
        "names": (
            "db",
            "auth",
            "cache",
            "users",
            "billing",
            "search",
            "mailer",
            "queue",
            "storage",
            "logging",
            "metrics",
            "session",
            "payments",
            "profile",
            "upload",
            "reports",
            "scheduler",
            "webhooks",
            "settings",
            "tokens",
            "audit",
            "export",
        ),
        "keys": (
            "url",
            "pool",
            "timeout",
            "retries",
            "host",
            "port",
            "secret",
            "ttl",
            "level",
            "handler",
            "backend",
            "region",
            "bucket",
            "prefix",
            "limit",
            "workers",
            "mode",
            "format",
            "encoding",
            "version",
        ),
        "values": (
            "sqlite",
            "redis",
            "local",
            "debug",
            "json",
            "utf8",
            "fast",
            "eager",
            "lazy",
            "primary",
            "default",
            "strict",
            "gzip",
            "daily",
        ),
    },
    "benchmark": {
        "package": ("svc", "engine", "platform", "kit"),
        "names": (
            "ledger",
            "router",
            "catalog",
            "inventory",
            "gateway",
            "notifier",
            "indexer",
            "archive",
            "pricing",
            "checkout",
            "shipping",
            "tenant",
            "quota",
            "telemetry",
            "registry",
            "sandbox",
            "workflow",
            "vault",
            "invoice",
            "locale",
            "feeds",
            "ranking",
        ),
        "keys": (
            "endpoint",
            "capacity",
            "deadline",
            "backoff",
            "shard",
            "replica",
            "cipher",
            "horizon",
            "verbosity",
            "adapter",
            "driver",
            "zone",
            "container",
            "namespace",
            "ceiling",
            "threads",
            "profile_id",
            "schema",
            "charset",
            "revision",
        ),
        "values": (
            "postgres",
            "memcached",
            "remote",
            "trace",
            "yaml",
            "latin1",
            "slow",
            "batch",
            "stream",
            "replica",
            "fallback",
            "lenient",
            "zstd",
            "weekly",
        ),
    },
}

# Per-tool base latency in seconds; the multiplier is log-normal with a Pareto tail.
_BASE_LATENCY = {
    "create_file": 0.05,
    "write": 0.05,
    "run_check": 1.5,
    "fix": 0.8,
    "submit": 0.02,
    "error": 0.02,
}
_TAIL_P = 0.03


@dataclass(frozen=True)
class ComponentSpec:
    """One file to build: ``fields`` are (key, value) pairs, to be written in this order.
    ``flaky`` (hidden from the prompt) makes the first ``run_check`` fail until ``fix``."""

    name: str
    kind: str
    path: str
    fields: tuple[tuple[str, str], ...]
    flaky: bool = False

    def __post_init__(self) -> None:
        for label, token in (("name", self.name), ("kind", self.kind), ("path", self.path)):
            _check_token(f"component {label}", token)
        if not self.fields:
            raise ValueError(f"component {self.name!r} has no fields")
        keys = [k for k, _ in self.fields]
        dup = _first_duplicate(keys)
        if dup is not None:
            raise ValueError(f"component {self.name!r} has duplicate key {dup!r}")
        for key, value in self.fields:
            _check_token(f"key of {self.name!r}", key)
            _check_token(f"value of {self.name}.{key}", value)


@dataclass(frozen=True)
class TaskSpec:
    """A repository to build. Raises ``ValueError`` on an empty component list or duplicate
    component names or paths."""

    task_id: str
    split: str
    size: str
    components: tuple[ComponentSpec, ...]

    def __post_init__(self) -> None:
        if not self.components:
            raise ValueError(f"task {self.task_id!r} has an empty component list")
        dup = _first_duplicate([c.name for c in self.components])
        if dup is not None:
            raise ValueError(f"task {self.task_id!r} has duplicate component name {dup!r}")
        dup = _first_duplicate([c.path for c in self.components])
        if dup is not None:
            raise ValueError(f"task {self.task_id!r} has duplicate component path {dup!r}")

    def component(self, name: str) -> ComponentSpec | None:
        for c in self.components:
            if c.name == name:
                return c
        return None

    @property
    def optimal_steps(self) -> int:
        """Tool calls the oracle needs: create + writes + check (+ fix + re-check if flaky)."""
        return sum(2 + len(c.fields) + (2 if c.flaky else 0) for c in self.components)

    def prompt(self) -> str:
        lines = [
            f"Task {self.task_id}: build a repository with {len(self.components)} components.",
            "Tools (one call per line):",
            "  create_file <path>",
            "  write <path> <key> <value>   (keys in the order listed)",
            "  run_check <component>",
            "  fix <component>              (after a failing check)",
            "  submit                       (end the episode)",
            "Components:",
        ]
        for c in self.components:
            body = ", ".join(f"{k}={v}" for k, v in c.fields)
            lines.append(f"- {c.name} ({c.kind}) at {c.path}: {body}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Observation:
    text: str
    done: bool
    progress: float
    latency_s: float
    ok: bool = True


@dataclass
class _File:
    fields: list[tuple[str, str]] = field(default_factory=list)
    verified: bool = False
    fixed: bool = False


class RepoEnv:
    """One episode on a :class:`TaskSpec`. ``max_steps`` (default: twice the oracle horizon
    plus 10) ends the episode and keeps the progress reached. ``hints`` adds the status
    line (see the module docstring) to the prompt and to every observation."""

    def __init__(
        self, spec: TaskSpec, max_steps: int | None = None, seed: int = 0, *, hints: bool = False
    ) -> None:
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.spec = spec
        self.hints = hints
        self.max_steps = max_steps if max_steps is not None else 2 * spec.optimal_steps + 10
        self.steps = 0
        self.done = False
        self._files: dict[str, _File] = {}
        self._by_path = {c.path: c for c in spec.components}
        self._rng = random.Random(f"{spec.task_id}/{seed}")

    # --- scoring -------------------------------------------------------------------------

    def hidden_check(self, name: str) -> bool:
        comp = self.spec.component(name)
        if comp is None:
            return False
        f = self._files.get(comp.path)
        return f is not None and f.verified and tuple(f.fields) == comp.fields

    @property
    def progress(self) -> float:
        passed = sum(self.hidden_check(c.name) for c in self.spec.components)
        return passed / len(self.spec.components)

    @property
    def credit(self) -> float:
        """Finer partial credit in [0, 1], a shaped reward: the share of the task's units
        of work done -- per component, its file exists, each spec key holds its value (in
        order, from the first), and its check passed -- so it moves before a whole component
        does. ``progress`` (whole components) stays the score; ``credit`` is 1 exactly when
        ``progress`` is."""
        done = total = 0
        for c in self.spec.components:
            total += len(c.fields) + 2
            if self.hidden_check(c.name):
                done += len(c.fields) + 2
                continue
            f = self._files.get(c.path)
            if f is None:
                continue
            done += 1
            for got, want in zip(f.fields, c.fields, strict=False):
                if got != want:
                    break
                done += 1
        return done / total

    def status_line(self) -> str:
        """The agent's status bar ("" when every component is complete): ``focus: <path>
        <state>`` for the first component whose file is not fully written -- state
        ``missing`` (no file yet) or ``<key> <value>`` (the next key to write and its
        value) -- preceded by ``untested: <name> | `` for the latest component fully written
        whose check has not passed (the one just written, when it is). It says what is untested, not when to
        check: that is the agent's call."""
        parts = []
        for c in reversed(self.spec.components):  # the latest written: the one just done
            f = self._files.get(c.path)
            if f is not None and len(f.fields) >= len(c.fields) and not self.hidden_check(c.name):
                parts.append(f"untested: {c.name}")
                break
        # The focus goes last, right above the next action: what an action copies from it
        # then sits at the same distance back whatever else the bar says.
        for c in self.spec.components:
            f = self._files.get(c.path)
            if f is None:
                parts.append(f"focus: {c.path} missing")
                break
            if len(f.fields) < len(c.fields):
                parts.append(f"focus: {c.path} {' '.join(c.fields[len(f.fields)])}")
                break
        return " | ".join(parts)

    def _with_status(self, text: str) -> str:
        line = self.status_line() if self.hints else ""
        return f"{text}\n{line}" if line else text

    # --- stepping ------------------------------------------------------------------------

    def reset(self) -> Observation:
        self.steps = 0
        self.done = False
        self._files = {}
        return Observation(self._with_status(self.spec.prompt()), False, 0.0, 0.0)

    def step(self, text: str) -> Observation:
        if self.done:
            return Observation("error: episode is over", True, self.progress, 0.0, ok=False)
        self.steps += 1
        try:
            tool, ok, msg = self._dispatch(text)
        except Exception as e:  # defensive: step() never raises on model text
            tool, ok, msg = "error", False, f"error: {type(e).__name__}: {e}"
        progress = self.progress
        if progress >= 1.0:
            self.done = True
            msg += "\nall checks pass"
        elif tool == "submit" and ok:
            self.done = True
        elif self.steps >= self.max_steps:
            self.done = True
            msg += f"\nstep budget of {self.max_steps} exhausted"
        if not self.done:
            msg = self._with_status(msg)
        return Observation(msg, self.done, progress, self._latency(tool), ok=ok)

    def _latency(self, tool: str) -> float:
        lat = _BASE_LATENCY.get(tool, 0.02) * self._rng.lognormvariate(0.0, 1.0)
        if self._rng.random() < _TAIL_P:
            lat *= 10.0 * self._rng.paretovariate(1.5)
        return round(lat, 6)

    def _dispatch(self, text: str) -> tuple[str, bool, str]:
        if not isinstance(text, str):
            return "error", False, "error: a tool call must be text"
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        if not lines:
            return "error", False, "error: empty tool call"
        parts = lines[0].split()
        tool, args = parts[0], parts[1:]
        if tool == "create_file":
            return tool, *self._create(args)
        if tool == "write":
            return tool, *self._write(args)
        if tool == "run_check":
            return tool, *self._run_check(args)
        if tool == "fix":
            return tool, *self._fix(args)
        if tool == "submit":
            if args:
                return "error", False, "error: usage: submit"
            return tool, True, f"submitted with progress {self.progress:.2f}"
        return "error", False, f"error: unknown tool {tool[:40]!r}; tools: {', '.join(TOOLS)}"

    def _create(self, args: list[str]) -> tuple[bool, str]:
        if len(args) != 1:
            return False, "error: usage: create_file <path>"
        path = args[0]
        if path in self._files:
            return False, f"error: {path} already exists"
        if path not in self._by_path:
            return False, f"error: {path[:60]} is not in the spec"
        self._files[path] = _File()
        return True, f"created {path}"

    def _write(self, args: list[str]) -> tuple[bool, str]:
        if len(args) != 3:
            return False, "error: usage: write <path> <key> <value>"
        path, key, value = args
        f = self._files.get(path)
        if f is None:
            return False, f"error: no such file {path[:60]}; create_file it first"
        comp = self._by_path[path]
        written = [k for k, _ in f.fields]
        if key in written:
            f.fields[written.index(key)] = (key, value)
        else:
            if len(written) >= len(comp.fields):
                return False, f"error: {path} has all its keys; {key[:40]!r} is not one"
            expected = comp.fields[len(written)][0]
            if key != expected:
                return False, f"error: write {expected!r} next in {path}, not {key[:40]!r}"
            f.fields.append((key, value))
        f.verified = False
        return True, f"wrote {key} in {path}"

    def _component_arg(self, tool: str, args: list[str]) -> ComponentSpec | str:
        if len(args) != 1:
            return f"error: usage: {tool} <component>"
        comp = self.spec.component(args[0])
        if comp is None:
            return f"error: unknown component {args[0][:40]!r}"
        return comp

    def _run_check(self, args: list[str]) -> tuple[bool, str]:
        comp = self._component_arg("run_check", args)
        if isinstance(comp, str):
            return False, comp
        f = self._files.get(comp.path)
        if f is None:
            return True, f"FAIL {comp.name}: {comp.path} does not exist"
        got = dict(f.fields)
        for key, value in comp.fields:
            if key not in got:
                return True, f"FAIL {comp.name}: missing key {key}"
            if got[key] != value:
                return True, f"FAIL {comp.name}: wrong value for {key}"
        if comp.flaky and not f.fixed:
            return True, f"FAIL {comp.name}: check crashed in setup; run `fix {comp.name}`"
        f.verified = True
        return True, f"PASS {comp.name}"

    def _fix(self, args: list[str]) -> tuple[bool, str]:
        comp = self._component_arg("fix", args)
        if isinstance(comp, str):
            return False, comp
        f = self._files.get(comp.path)
        if f is None:
            return False, f"error: {comp.path} does not exist"
        if not comp.flaky or f.fixed:
            return True, f"nothing to fix in {comp.name}"
        f.fixed = True
        return True, f"fixed check setup for {comp.name}"


# --- task generation -------------------------------------------------------------------------


def make_task(split: Split, size: Size, seed: int) -> TaskSpec:
    """One task, a pure function of (split, size, seed). ``heldout`` uses the train
    vocabulary with a random stream of its own (see the module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    if size not in _SIZE_SHAPE:
        raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
    vocab = _VOCAB["train" if split == "heldout" else split]
    rng = random.Random(f"repo_suite/{split}/{size}/{seed}")
    (clo, chi), (klo, khi) = _SIZE_SHAPE[size]
    package = rng.choice(vocab["package"])
    names = rng.sample(vocab["names"], rng.randint(clo, chi))
    kinds = sorted(_EXT)
    comps = []
    for name in names:
        kind = rng.choice(kinds)
        keys = rng.sample(vocab["keys"], rng.randint(klo, khi))
        fields = tuple((k, f"{rng.choice(vocab['values'])}-{rng.randint(1, 99)}") for k in keys)
        path = f"{package}/{name}.{_EXT[kind]}"
        comps.append(ComponentSpec(name, kind, path, fields, flaky=rng.random() < _FLAKY_P))
    return TaskSpec(f"{split}-{size}-{seed}", split, size, tuple(comps))


def load_suite(
    split: Split = "train", n: int = 100, seed: int = 0, sizes: tuple[Size, ...] = SIZES
) -> list[TaskSpec]:
    """``n`` tasks, cycling through ``sizes``; deterministic in (split, n, seed, sizes)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not sizes:
        raise ValueError("sizes must not be empty")
    return [make_task(split, sizes[i % len(sizes)], seed * 1_000_003 + i) for i in range(n)]


# --- reference policies ----------------------------------------------------------------------


def scripted_actions(spec: TaskSpec) -> list[str]:
    """The oracle: builds every component in order (it knows which checks are flaky)."""
    actions: list[str] = []
    for c in spec.components:
        actions.append(f"create_file {c.path}")
        actions.extend(f"write {c.path} {k} {v}" for k, v in c.fields)
        actions.append(f"run_check {c.name}")
        if c.flaky:
            actions += [f"fix {c.name}", f"run_check {c.name}"]
    return actions


def random_actions(spec: TaskSpec, n: int, seed: int = 0) -> list[str]:
    """An untrained baseline: ``n`` tool calls with tools and arguments drawn uniformly from
    the spec's own vocabulary (paths, names, keys, values), ignoring order."""
    rng = random.Random(f"random/{spec.task_id}/{seed}")
    paths = [c.path for c in spec.components]
    names = [c.name for c in spec.components]
    keys = sorted({k for c in spec.components for k, _ in c.fields})
    values = sorted({v for c in spec.components for _, v in c.fields})
    out: list[str] = []
    for _ in range(n):
        tool = rng.choice(TOOLS[:4])
        if tool == "create_file":
            out.append(f"create_file {rng.choice(paths)}")
        elif tool == "write":
            out.append(f"write {rng.choice(paths)} {rng.choice(keys)} {rng.choice(values)}")
        else:
            out.append(f"{tool} {rng.choice(names)}")
    return out


def transcripts(
    split: Split, n: int, seed: int = 0, sizes: tuple[Size, ...] = SIZES, *, hints: bool = False
) -> list[str]:
    """Oracle episodes as text (prompt, then action and observation lines): a tokenizer
    corpus that covers the suite's words. An action starts its line, as a model writes it
    after the harness's ``> `` cue (tokenized apart)."""
    out = []
    for spec in load_suite(split, n, seed, sizes):
        env = RepoEnv(spec, hints=hints)
        lines = [env.reset().text]
        for action in scripted_actions(spec):
            lines += [action, env.step(action).text]
        out.append("\n".join(lines) + "\n")
    return out


def rollout(env: RepoEnv, actions: list[str]) -> tuple[float, int, float]:
    """Run ``actions`` until done: returns (progress, steps taken, total latency seconds)."""
    latency = 0.0
    for a in actions:
        obs = env.step(a)
        latency += obs.latency_s
        if obs.done:
            break
    return env.progress, env.steps, latency


def _check_token(label: str, token: str) -> None:
    if not isinstance(token, str) or not token or any(ch.isspace() for ch in token):
        raise ValueError(f"{label} must be a non-empty token without whitespace: {token!r}")


def _first_duplicate(items: list[str]) -> str | None:
    seen: set[str] = set()
    for x in items:
        if x in seen:
            return x
        seen.add(x)
    return None


__all__ = [
    "SIZES",
    "SPLITS",
    "TOOLS",
    "ComponentSpec",
    "Observation",
    "RepoEnv",
    "TaskSpec",
    "load_suite",
    "make_task",
    "random_actions",
    "rollout",
    "scripted_actions",
    "transcripts",
]
