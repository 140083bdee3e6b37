"""External agents on a real engine: a command or a callable plays a coding task through the
endpoint; one that crashes, hangs or overruns its budget fails (or times out) that rollout
alone, with what it did kept; a plugin path that does not import is refused by field."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gyre_core.config import ConfigError, RunConfig
from gyre_core.events import ListSink
from gyre_core.rollout.config import RolloutConfig
from gyre_core.rollout.endpoint import Endpoint
from gyre_core.rollout.external import AgentTask, ExternalAgent, run_external
from gyre_core.rollout.plugins import PluginError
from gyre_core.rollout.router import Router
from gyre_core.rollout.task_env import make_env
from gyre_core.rollout.torch_engine import TorchEngine
from gyre_core.runtime.session import make_model_dir
from gyre_core.trajectory.failures import left_out

EXAMPLE = Path(__file__).parents[2] / "examples" / "react_agent" / "agent.py"
CFG = RolloutConfig(max_turns=5, max_new_tokens=16, token_budget=4096, time_budget_s=120.0)


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    md = make_model_dir(RunConfig.from_dict({"model": {"layers": 1}}), tmp_path_factory.mktemp("m"))
    return AutoModelForCausalLM.from_pretrained(
        str(md), dtype=torch.float32
    ), AutoTokenizer.from_pretrained(str(md))


def play(
    policy: tuple[Any, Any], agent: ExternalAgent, cfg: RolloutConfig = CFG, engine: Any = None
) -> tuple[Any, ListSink, Any]:
    model, tok = policy
    env = make_env("coding", "train", 0)
    sink = ListSink()

    async def main() -> Any:
        ep = Endpoint(tok)
        await ep.start()
        try:
            router = Router({"e": engine or TorchEngine(model)})
            return await run_external(
                agent, env, ep, router, cfg, rollout_id="r0", sink=sink, seed=3
            )
        finally:
            await ep.close()

    try:
        return asyncio.run(main()), sink, env
    finally:
        env.close()


def test_the_example_agent_plays_a_task_through_the_endpoint(policy) -> None:  # type: ignore[no-untyped-def]
    agent = ExternalAgent(command=("python", str(EXAMPLE), "--context-budget", "700"))
    r, sink, env = play(policy, agent)
    # the random policy never says DONE: its calls run out (a 429), it stops, the run submits
    assert r.status == "timeout" and r.extra["stop_reason"] == "max_turns" and len(r.calls) == 5
    assert env.env.done  # the hidden tests scored the folder it left
    kinds = [e.kind for e in sink.events]
    assert kinds[0] == "rollout_started" and kinds[-1] == "rollout_finished"
    assert kinds.count("rollout_progress") == 5  # one a call, for the dashboard
    assert "branch" in [c.kind for c in r.calls]  # it compacted past 700 prompt tokens


def test_a_crashing_command_fails_its_rollout_with_its_stderr(policy) -> None:  # type: ignore[no-untyped-def]
    code = "import sys; sys.stderr.write('agent blew up\\n'); sys.exit(3)"
    r, sink, _ = play(policy, ExternalAgent(command=(sys.executable, "-c", code)))
    assert r.status == "failed" and r.calls == [] and r.progress == 0.0
    assert r.failure == "agent" and left_out(r) == "excluded_agent"  # before its first call
    assert (
        "exited with code 3" in r.extra["stop_reason"]
        and "agent blew up" in r.extra["agent_stderr"]
    )
    assert sink.events[-1].kind == "rollout_finished" and sink.events[-1].status == "failed"


def live_with(token: str) -> list[int]:
    """The host's processes (not zombies) whose command line holds ``token``."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if not d.name.isdigit():
                continue
            mine = token in (d / "cmdline").read_bytes().decode(errors="replace")
            if mine and (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(d.name))
        except OSError:
            continue
    return out


def test_a_hanging_command_is_killed_at_the_time_budget(policy) -> None:  # type: ignore[no-untyped-def]
    token = f"gyre-hang-{uuid.uuid4().hex}"
    # a child that would outlive its parent unless the whole process group is killed
    code = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60) # {token}']); "
        "time.sleep(60)"
    )
    seen, done = [], threading.Event()

    def watch() -> None:  # the child did start (the test cannot pass on a command that failed)
        while not done.is_set() and not seen:
            seen.extend(live_with(token))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    t0 = time.monotonic()
    try:
        r, _, _ = play(
            policy,
            ExternalAgent(command=(sys.executable, "-c", code)),
            replace(CFG, time_budget_s=3.0),
        )
    finally:
        done.set()
        watcher.join()
    assert r.status == "timeout" and r.extra["stop_reason"] == "time_budget"
    assert time.monotonic() - t0 < 30 and seen
    time.sleep(0.5)
    assert live_with(token) == []


def test_a_callable_agent_that_raises_fails_its_rollout_alone(policy) -> None:  # type: ignore[no-untyped-def]
    async def agent(task: AgentTask) -> None:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
        await client.chat.completions.create(
            model=task.model, messages=[{"role": "user", "content": task.prompt}]
        )
        raise RuntimeError("the agent's own bug")

    r, _, _ = play(policy, ExternalAgent(call=agent))
    assert r.status == "failed" and "the agent's own bug" in r.extra["stop_reason"]
    assert len(r.calls) == 1  # what it did before failing is kept
    assert r.failure == "agent" and left_out(r) == ""  # a legitimate 0: scored


def test_an_agent_that_fails_on_the_engines_error_is_an_engine_failure(policy) -> None:  # type: ignore[no-untyped-def]
    """The engine could not serve a call, the agent gave up on the 500: the rollout's
    failure is the engine's, and it stays out of its group's statistics."""

    class Broken(TorchEngine):
        async def generate(self, prompt_ids, params, *, request_id):  # type: ignore[no-untyped-def]
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    async def agent(task: AgentTask) -> None:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
        await client.chat.completions.create(
            model=task.model, messages=[{"role": "user", "content": task.prompt}]
        )

    r, _, _ = play(policy, ExternalAgent(call=agent), engine=Broken(policy[0]))
    assert (r.status, r.failure, r.calls) == ("failed", "engine", [])
    assert "no engine available" in r.extra["engine_error"]  # the router marked it dead
    assert left_out(r) == "excluded_engine"


def test_plugin_paths_are_refused_by_field() -> None:
    with pytest.raises(PluginError, match=r"rollout\.agent: cannot import 'no_such_module_x'"):
        ExternalAgent.from_config(RolloutConfig(agent="no_such_module_x:run"))
    with pytest.raises(PluginError, match="has no attribute 'nope'"):
        ExternalAgent.from_config(RolloutConfig(agent="json:nope"))
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"rollout": {"agent": "json", "agent_command": "a 'b"}})
    assert {f for f, _ in e.value.errors} == {"rollout.agent", "rollout.agent_command"}
    with pytest.raises(ConfigError, match="not both"):
        RunConfig.from_dict({"rollout": {"agent": "json:loads", "agent_command": "python a.py"}})
