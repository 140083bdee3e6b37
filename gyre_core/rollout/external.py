"""External agents: a user's own agent plays a run's task through the OpenAI-compatible
endpoint, and the environment scores what it did.

A run names its agent in one of two ways (``rollout.agent`` / ``rollout.agent_command``):

* **A Python callable** by import path, ``"package.module:function"``: called with an
  :class:`AgentTask` (a coroutine function is awaited, a plain function runs in a thread);
* **A command line**, run once per rollout from the directory the run was started in, in a
  process group of its own and (by default) a bubblewrap sandbox, with a folder of its own
  (``HOME``) and an environment built from a list, nothing inherited
  (:mod:`~gyre_core.rollout.agent_sandbox`): ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (so
  an unmodified ``openai`` client talks to the run), ``GYRE_MODEL``, ``GYRE_TASK_ID``,
  ``GYRE_TASK_PROMPT``, ``GYRE_TASK_DIR`` (the task's folder, where the environment has one:
  ``workdir``), ``GYRE_SEED``. A command whose first word is ``python`` or ``python3`` runs
  under the run's own interpreter.

The agent's calls are recorded by its endpoint session (:mod:`~gyre_core.rollout.chat_session`).
When the agent returns, the environment's finishing action (the coding suite's ``submit``:
its hidden tests) runs if the agent did not end the episode, and the environment's progress
is the rollout's. The session's budgets apply as to built-in sessions: ``max_turns`` calls
and ``token_budget`` generated tokens (a call past them gets HTTP 429, and the rollout ends
with status ``timeout``), ``time_budget_s`` wall seconds (the agent is cancelled, its process
group killed: ``timeout``). An agent that raises or exits non-zero fails its rollout alone
(status ``failed``, the reason and the tail of its stderr in ``extra``): ``failure: engine``
when one of its calls got the engine's error (a 500 or 503; ``extra.engine_error``), a
rollout left out of training; else ``failure: agent``, whose calls until then are kept and
scored (one that failed before its first call has nothing to score and is left out).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gyre_core.events import EventSink, RolloutFinished, RolloutProgress, RolloutStarted
from gyre_core.rollout.agent_bridge import endpoint_bridge
from gyre_core.rollout.agent_sandbox import (
    SandboxError,
    agent_environment,
    bwrap_command,
    check_bwrap,
    operator_names,
    sandbox_setting,
)
from gyre_core.rollout.chat_session import ChatSession
from gyre_core.rollout.config import RolloutConfig
from gyre_core.rollout.endpoint import Endpoint
from gyre_core.rollout.plugins import PluginError, load_callable
from gyre_core.rollout.router import Router
from gyre_core.rollout.task_env import TaskEnv
from gyre_core.trajectory.format import Rollout

STDERR_TAIL = 2000  # characters of a failed agent's stderr kept in the rollout


@dataclass(frozen=True, slots=True)
class AgentTask:
    """What an external agent is given for one rollout."""

    base_url: str  # an OpenAI client's base_url: this rollout's own session
    api_key: str  # the session's key (the base URL alone is enough)
    model: str
    task_id: str
    prompt: str  # the environment's task prompt
    workdir: str | None  # the task's folder, where it has one
    seed: int


@dataclass(frozen=True, slots=True)
class ExternalAgent:
    """A run's external agent: a callable or a command line (exactly one)."""

    call: Callable[[AgentTask], Any] | None = None
    command: tuple[str, ...] = ()
    sandbox: str = ""  # a command's: "bwrap" or "none"; empty: GYRE_AGENT_SANDBOX's

    @classmethod
    def from_config(cls, cfg: RolloutConfig) -> ExternalAgent | None:
        """The configured agent (``RunConfig`` checked the fields' form); an import that
        fails is a :class:`~gyre_core.rollout.plugins.PluginError` naming ``rollout.agent``."""
        if cfg.agent:
            return cls(call=load_callable(cfg.agent, "rollout.agent"))
        argv = tuple(shlex.split(cfg.agent_command))
        if not argv:
            return None
        try:  # a sandbox that cannot work fails the run at its start, not each rollout
            sandbox = sandbox_setting()
            operator_names()
            if sandbox == "bwrap":
                check_bwrap()
        except SandboxError as e:
            raise PluginError("rollout.agent_command", str(e)) from e
        return cls(command=argv, sandbox=sandbox)

    async def run(self, task: AgentTask) -> None:
        """Play the task; raises :class:`AgentFailed` when the agent fails."""
        if self.call is not None:
            try:
                if inspect.iscoroutinefunction(self.call):
                    await self.call(task)
                else:
                    await asyncio.to_thread(self.call, task)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                raise AgentFailed(f"{type(e).__name__}: {e}", "") from e
            return
        await self._run_command(task)

    async def _run_command(self, task: AgentTask) -> None:
        session = {
            "OPENAI_BASE_URL": task.base_url,
            "OPENAI_API_KEY": task.api_key,
            "GYRE_MODEL": task.model,
            "GYRE_TASK_ID": task.task_id,
            "GYRE_TASK_PROMPT": task.prompt,
            "GYRE_TASK_DIR": task.workdir or "",
            "GYRE_SEED": str(task.seed),
        }
        argv = list(self.command)
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        home = Path(tempfile.mkdtemp(prefix="gyre-agent-")).resolve()
        try:
            (home / "tmp").mkdir()
            env = agent_environment(session, home)
            if (self.sandbox or sandbox_setting()) == "none":
                await self._spawn(argv, env)
                return
            url = urlsplit(task.base_url)  # the endpoint's loopback address, reached by a bridge
            port = url.port or 80
            argv = bwrap_command(argv, home, task.workdir, port)
            async with endpoint_bridge(home, url.hostname or "127.0.0.1", port):
                await self._spawn(argv, env)
        except SandboxError as e:
            raise AgentFailed(str(e), "") from e
        finally:
            shutil.rmtree(home, ignore_errors=True)

    @staticmethod
    async def _spawn(argv: list[str], env: dict[str, str]) -> None:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: a kill takes its children too
        )
        try:
            _, err = await proc.communicate()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        if proc.returncode != 0:
            tail = err.decode(errors="replace")[-STDERR_TAIL:]
            raise AgentFailed(f"agent command exited with code {proc.returncode}", tail)


class AgentFailed(Exception):
    def __init__(self, reason: str, stderr: str) -> None:
        super().__init__(reason)
        self.reason, self.stderr = reason, stderr


async def run_external(
    agent: ExternalAgent,
    env: TaskEnv,
    endpoint: Endpoint,
    router: Router,
    cfg: RolloutConfig,
    *,
    rollout_id: str,
    group_id: str = "",
    sink: EventSink,
    seed: int = 0,
    step: int = 0,
) -> Rollout:
    """Play one rollout of ``env`` with ``agent`` through ``endpoint`` (see the module)."""
    t0 = time.monotonic()
    sink.emit(RolloutStarted(t=0.0, rollout_id=rollout_id, task_id=env.task_id,
                             group_id=group_id or rollout_id, step=step))  # fmt: skip
    prompt = await asyncio.to_thread(env.reset)

    def report(chat: ChatSession) -> None:
        kinds = Counter(c.kind for c in chat.calls)
        sink.emit(RolloutProgress(
            t=time.monotonic() - t0, rollout_id=rollout_id, turns=len(chat.calls),
            tokens=chat.generated, progress=float(env.progress()), branches=dict(kinds),
        ))  # fmt: skip

    session = endpoint.open(
        rollout_id, router, max_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
        seed=seed, max_calls=cfg.max_turns, token_budget=cfg.token_budget, on_call=report,
    )  # fmt: skip
    workdir = getattr(env, "workdir", None)
    task = AgentTask(session.base_url, session.key, endpoint.model, env.task_id, prompt,
                     str(workdir) if workdir is not None else None, seed)  # fmt: skip
    status, reason, stderr = "completed", None, ""
    try:
        await asyncio.wait_for(agent.run(task), timeout=cfg.time_budget_s or None)
    except TimeoutError:
        status, reason = "timeout", "time_budget"
    except AgentFailed as e:
        status, reason, stderr = "failed", e.reason, e.stderr
    finally:
        chat = endpoint.close_session(session.key)
    if status == "completed" and session.stop_reason:
        status, reason = "timeout", session.stop_reason
    finish = env.finish_action()
    if finish is not None:
        await asyncio.to_thread(env.step, finish)
    progress = float(env.progress())
    versions = [int(v) for c in chat.calls for v in c.versions]
    sink.emit(RolloutFinished(
        t=time.monotonic() - t0, rollout_id=rollout_id, status=status, progress=progress,
        reward=progress, turns=len(chat.calls), tokens=chat.generated,
        versions=(min(versions), max(versions)) if versions else (0, 0),
    ))  # fmt: skip
    extra: dict[str, object] = {"turns": len(chat.calls), "tokens_generated": chat.generated,
                                "clock_s": round(time.monotonic() - t0, 6), "stop_reason": reason,
                                "seed": seed, "agent": "external"}  # fmt: skip
    rollout = chat.rollout(env.task_id, status, progress, group_id, extra)
    return _what_failed(rollout, session.engine_error, stderr)


def _what_failed(rollout: Rollout, engine_error: str, stderr: str) -> Rollout:
    """A failed rollout's ``failure``: the engine's when a call of its agent got the engine's
    error (kept in ``extra.engine_error``), else the agent's (its stderr's tail kept)."""
    if stderr:
        rollout.extra["agent_stderr"] = stderr
    if rollout.status == "failed":
        rollout.failure = "engine" if engine_error else "agent"
        if engine_error:
            rollout.extra["engine_error"] = engine_error
    return rollout


__all__ = ["AgentTask", "ExternalAgent", "run_external"]
