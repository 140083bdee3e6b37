"""What an agent command can see and touch: real commands under real bubblewrap.

Its environment is the documented list plus the operator's variables (never the worker's
secrets); it cannot see another running agent's processes (their pids, their environment),
its folder or its task's folder, nor write outside its own folders; a missing ``bwrap``
fails the run at its start, saying so."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from pathlib import Path

import pytest

from gyre_core.rollout.config import RolloutConfig
from gyre_core.rollout.external import AgentFailed, AgentTask, ExternalAgent
from gyre_core.rollout.plugins import PluginError

SECRET = "s3cret-key-" + "x" * 40
DOCUMENTED = {"OPENAI_BASE_URL", "OPENAI_API_KEY", "GYRE_MODEL", "GYRE_TASK_ID",
              "GYRE_TASK_PROMPT", "GYRE_TASK_DIR", "GYRE_SEED", "HOME", "TMPDIR", "PATH",
              "LANG", "PWD"}  # fmt: skip

# Writes its environment, its folders and what it can see of /proc to report.json in its
# task's folder.
DUMP_ENV = """
import json, os
home, tmp = os.environ.get("HOME", ""), os.environ.get("TMPDIR", "")
writable = "gyre-agent-" in home and "gyre-agent-" in tmp  # (never the worker's own HOME)
if writable:
    open(os.path.join(home, "mine.txt"), "w").write("ok")
    open(os.path.join(tmp, "t.txt"), "w").write("ok")
report = {"env": dict(os.environ), "cwd": os.getcwd(), "writable": writable}
json.dump(report, open(os.path.join(os.environ["GYRE_TASK_DIR"], "report.json"), "w"))
"""

# Agent A: tells where its folder is, keeps a file there, then waits to be told to stop.
HOLD = """
import os, time
d, home = os.environ["GYRE_TASK_DIR"], os.environ["HOME"]
open(os.path.join(home, "private.txt"), "w").write("A's own")
open(os.path.join(d, "home.txt"), "w").write(home)
for _ in range(600):
    if os.path.exists(os.path.join(d, "stop")):
        break
    time.sleep(0.05)
"""

# Agent B: given A's host pids, folders and key, tries to reach them and to write outside.
PROBE = """
import json, os
p = json.loads(os.environ["GYRE_TASK_PROMPT"])
p["token"], p["key"] = p["token"][::-1], p["key"][::-1]  # (its own environment holds them so)
out = {"pids_seen": [], "environ": {}, "listed": {}, "read": {}, "wrote": {}}
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            if p["token"] in open(f"/proc/{pid}/cmdline").read():
                out["pids_seen"].append(pid)
            if p["key"] in open(f"/proc/{pid}/environ").read():
                out["pids_seen"].append(pid)
        except OSError:
            pass
for pid in p["pids"]:
    try:
        out["environ"][pid] = p["key"] in open(f"/proc/{pid}/environ").read()
    except OSError as e:
        out["environ"][pid] = type(e).__name__
for folder in p["folders"]:
    try:
        out["listed"][folder] = os.listdir(folder)
    except OSError as e:
        out["listed"][folder] = type(e).__name__
try:
    out["read"]["private"] = open(os.path.join(p["home"], "private.txt")).read()
except OSError as e:
    out["read"]["private"] = type(e).__name__
for path in p["outside"]:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").write("escaped")
        out["wrote"][path] = True
    except OSError as e:
        out["wrote"][path] = type(e).__name__
json.dump(out, open(os.path.join(os.environ["GYRE_TASK_DIR"], "report.json"), "w"))
"""


def task(folder: Path, prompt: str = "do it", key: str = "k") -> AgentTask:
    folder.mkdir(parents=True, exist_ok=True)
    return AgentTask("http://127.0.0.1:59999/v1", key, "gyre-policy", "t0", prompt, str(folder), 7)


def command(code: str, *extra: str) -> ExternalAgent:
    return ExternalAgent(command=(sys.executable, "-c", code, *extra))


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's environment: its secrets, an unlisted variable and an operator-listed one."""
    monkeypatch.setenv("GYRE_SECRET_KEY", SECRET)
    monkeypatch.setenv("DATABASE_URL", "postgres://gyre:pw-42@127.0.0.1:5432/gyre")
    monkeypatch.setenv("GYRE_UNLISTED_VAR", "not for agents")
    monkeypatch.setenv("GYRE_TEST_OPERATOR_VAR", "passed on")
    monkeypatch.setenv("GYRE_AGENT_ENV", "GYRE_TEST_OPERATOR_VAR, GYRE_NOT_SET_VAR")


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_an_agent_gets_the_documented_environment_and_no_secret(
    sandbox: str, worker_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYRE_AGENT_SANDBOX", sandbox)
    t = task(tmp_path / "task", key="session-key-1")
    asyncio.run(command(DUMP_ENV).run(t))
    report = json.loads((tmp_path / "task" / "report.json").read_text())
    env = report["env"]
    assert SECRET not in json.dumps(report) and "pw-42" not in json.dumps(report)
    assert set(env) == DOCUMENTED | {"GYRE_TEST_OPERATOR_VAR"}  # nothing else passes
    assert env["GYRE_TEST_OPERATOR_VAR"] == "passed on"
    assert env["OPENAI_API_KEY"] == "session-key-1" and env["GYRE_SEED"] == "7"
    assert env["OPENAI_BASE_URL"] == t.base_url and env["GYRE_TASK_DIR"] == t.workdir
    home = Path(env["HOME"])
    assert home != Path.home() and home.name.startswith("gyre-agent-")
    assert Path(env["TMPDIR"]) == home / "tmp" and report["writable"]
    assert report["cwd"] == os.getcwd()  # relative paths of its command line still resolve
    assert not home.exists()  # its folder is removed when it ends


def test_an_agent_cannot_reach_another_running_agent_or_write_outside(
    worker_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GYRE_AGENT_SANDBOX", raising=False)  # the default: bwrap
    token, key_a = f"gyre-agent-a-{uuid.uuid4().hex}", f"key-of-a-{uuid.uuid4().hex}"
    dir_a, dir_b = tmp_path / "a", tmp_path / "b"
    escape_tmp = tmp_path / "outside" / "escaped.txt"  # a host path outside its folders
    escape_cwd = Path.cwd() / f"escaped-{uuid.uuid4().hex}.txt"  # where the run started

    async def main() -> dict[str, object]:
        agent_a = asyncio.create_task(command(HOLD, token).run(task(dir_a, key=key_a)))
        for _ in range(400):
            if (dir_a / "home.txt").exists() or agent_a.done():
                break
            await asyncio.sleep(0.05)
        home_a = (dir_a / "home.txt").read_text()
        pids = [str(p) for p in live_with(token)]
        assert pids, "agent A is running"
        assert any(key_a in Path(f"/proc/{p}/environ").read_text() for p in pids)
        prompt = json.dumps({
            "token": token[::-1], "key": key_a[::-1], "pids": pids, "home": home_a,
            "folders": [home_a, str(dir_a)],
            "outside": [str(escape_tmp), str(escape_cwd), "/usr/escaped.txt", "/etc/escaped"],
        })  # fmt: skip
        try:
            await command(PROBE).run(task(dir_b, prompt=prompt))
        finally:
            (dir_a / "stop").write_text("")
            await agent_a
        return json.loads((dir_b / "report.json").read_text())

    try:
        report = asyncio.run(main())
    finally:  # (what the old, unconfined command could leave)
        for path in (escape_cwd, Path("/usr/escaped.txt"), Path("/etc/escaped")):
            with contextlib.suppress(OSError):
                path.unlink()
    assert report["pids_seen"] == []  # A's processes are not even listed in its /proc
    assert all(v != True for v in report["environ"].values())  # noqa: E712
    assert all(v == "FileNotFoundError" for v in report["listed"].values())
    assert report["read"]["private"] == "FileNotFoundError"
    wrote = report["wrote"]
    assert wrote.pop(str(escape_tmp)) is True  # into its private /tmp, which is not the host's
    # read-only elsewhere; a start directory under /tmp (a clone there) is inside that
    # private /tmp too, so a write there lands in the sandbox's own tmpfs, never the host's
    private = [p for p, v in wrote.items() if v is True]
    assert all(Path(p).is_relative_to("/tmp") for p in private), wrote
    assert not escape_tmp.exists() and not escape_cwd.exists()


def live_with(token: str) -> list[int]:
    """The host's processes whose command line holds ``token``."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and token in (d / "cmdline").read_bytes().decode(errors="replace"):
                out.append(int(d.name))
        except OSError:
            continue
    return out


def test_a_missing_bwrap_fails_the_run_at_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gyre_core.rollout import agent_sandbox

    monkeypatch.delenv("GYRE_AGENT_SANDBOX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap there
    agent_sandbox._bwrap_problem.cache_clear()
    try:
        with pytest.raises(PluginError, match=r"rollout\.agent_command: .*`bubblewrap` package"):
            ExternalAgent.from_config(RolloutConfig(agent_command="python agent.py"))
        with pytest.raises(AgentFailed, match="bubblewrap"):  # and at a rollout, not unconfined
            asyncio.run(ExternalAgent(command=("true",), sandbox="bwrap").run(task(tmp_path)))
    finally:
        agent_sandbox._bwrap_problem.cache_clear()
    monkeypatch.setenv("GYRE_AGENT_SANDBOX", "none")  # the terminal user's explicit choice
    assert ExternalAgent.from_config(RolloutConfig(agent_command="python a.py")).sandbox == "none"


def test_bad_sandbox_settings_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYRE_AGENT_SANDBOX", "docker")
    with pytest.raises(PluginError, match="GYRE_AGENT_SANDBOX='docker': must be one of bwrap"):
        ExternalAgent.from_config(RolloutConfig(agent_command="python agent.py"))
    monkeypatch.setenv("GYRE_AGENT_SANDBOX", "bwrap")
    monkeypatch.setenv("GYRE_AGENT_ENV", "OK_NAME,not-a-name")
    with pytest.raises(PluginError, match="GYRE_AGENT_ENV: not a variable name: 'not-a-name'"):
        ExternalAgent.from_config(RolloutConfig(agent_command="python agent.py"))


READ_PATHS = """
import json, os, sys
from helper import VALUE  # beside the agent's script: its folder is there
out = {"helper": VALUE, "read": {}}
for path in json.loads(os.environ["GYRE_TASK_PROMPT"]):
    try:
        out["read"][path] = open(path).read()
    except OSError as e:
        out["read"][path] = type(e).__name__
json.dump(out, open(os.path.join(os.environ["GYRE_TASK_DIR"], "report.json"), "w"))
"""


def test_the_data_dir_and_the_start_directory_are_not_in_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the agent's own files are there: not the data directory (hidden or set by
    GYRE_DATA_DIR), even when its command line names them, nor the rest of the directory
    the run started in."""
    monkeypatch.delenv("GYRE_AGENT_SANDBOX", raising=False)
    start = tmp_path / "start"
    files = {".data/runs/1/weights.txt": "team A's weights", "data2/gyre.sqlite3": "the db",
             "settings.env": "GYRE_SECRET_KEY=x", "agents/mine/helper.py": "VALUE = 'helper'",
             "agents/mine/agent.py": READ_PATHS}  # fmt: skip
    for name, text in files.items():
        (start / name).parent.mkdir(parents=True, exist_ok=True)
        (start / name).write_text(text)
    monkeypatch.setenv("GYRE_DATA_DIR", str(start / "data2"))
    monkeypatch.chdir(start)
    secrets = [".data/runs/1/weights.txt", "data2/gyre.sqlite3", "settings.env"]
    agent = ExternalAgent(command=("python", "agents/mine/agent.py", *secrets[:2]))
    asyncio.run(agent.run(task(tmp_path / "task", prompt=json.dumps(secrets))))
    report = json.loads((tmp_path / "task" / "report.json").read_text())
    assert report["helper"] == "helper"
    assert report["read"] == {p: "FileNotFoundError" for p in secrets}


CONNECT = """
import json, os, socket
from urllib.parse import urlsplit
p = json.loads(os.environ["GYRE_TASK_PROMPT"])
out = {}
url = urlsplit(os.environ["OPENAI_BASE_URL"])
with socket.create_connection((url.hostname, url.port), timeout=5) as s:  # its endpoint
    s.sendall(b"ping")
    out["endpoint"] = s.recv(100).decode()
for port in p["ports"]:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        out[str(port)] = "connected"
    except OSError as e:
        out[str(port)] = type(e).__name__
json.dump(out, open(os.path.join(os.environ["GYRE_TASK_DIR"], "report.json"), "w"))
"""


def test_an_agent_reaches_its_endpoint_and_nothing_else_on_the_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its base URL's loopback port is its session's endpoint (here an echo server); the
    host's other loopback services (one of the test's own, Postgres, Redis) are not there."""
    monkeypatch.delenv("GYRE_AGENT_SANDBOX", raising=False)
    accepted: list[int] = []

    async def main() -> None:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(b"pong:" + await r.read(100))
            await w.drain()
            w.close()

        async def service(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            accepted.append(1)
            w.close()

        endpoint = await asyncio.start_server(echo, "127.0.0.1", 0)
        other = await asyncio.start_server(service, "127.0.0.1", 0)
        port, other_port = (s.sockets[0].getsockname()[1] for s in (endpoint, other))
        t = AgentTask(f"http://127.0.0.1:{port}/s/k/v1", "k", "m", "t0",
                      json.dumps({"ports": [other_port, 5432, 6379]}), str(tmp_path), 0)  # fmt: skip
        try:
            await command(CONNECT).run(t)
        finally:
            endpoint.close()
            other.close()
        report = json.loads((tmp_path / "report.json").read_text())
        assert report.pop("endpoint") == "pong:ping"
        assert report == {str(p): "ConnectionRefusedError" for p in (other_port, 5432, 6379)}

    asyncio.run(main())
    assert accepted == []
