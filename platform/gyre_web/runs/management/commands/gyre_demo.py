"""``manage.py gyre_demo``: the README's main job — the platform with a demo training run.

Migrates the database, makes a demo account in a demo team, starts the web server (daphne:
API, dashboard, websocket) and a Celery worker as child processes, launches the demo run
through the same service the API uses, prints how to log in, and follows the run's events
on the terminal. It keeps serving until Ctrl-C (or SIGTERM), then stops both children;
``--exit-when-done`` stops when the run ends (tests and CI).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from gyre_core.config import ConfigError, load_config
from gyre_core.events import PhaseProgress
from gyre_web.runs import services
from gyre_web.runs.models import Experiment, Run, RunEvent
from gyre_web.teams.models import Team
from gyre_web.teams.services import create_team

REPO = Path(__file__).resolve().parents[5]
DEMO_USER, DEMO_PASSWORD, DEMO_TEAM = "demo", "demo", "Demo team"
TERMINAL = ("succeeded", "failed", "cancelled")


class _Stop(Exception):
    pass


def _on_signal(signum: int, frame: Any) -> None:
    raise _Stop


class Command(BaseCommand):
    help = "Run the platform with a demo training run (web server + worker + the run)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--config", default=str(REPO / "configs" / "demo.yaml"))
        parser.add_argument("--exit-when-done", action="store_true")
        parser.add_argument("--no-run", action="store_true", help="serve only; launch nothing")

    def handle(self, *args: Any, **opts: Any) -> None:
        signal.signal(signal.SIGTERM, _on_signal)
        try:  # a bad demo config fails before anything starts; relative paths (the
            # shipped warm start) are made absolute against the current directory
            config = load_config(opts["config"]).to_dict()
        except (ConfigError, OSError) as err:
            raise CommandError(f"{opts['config']}: {err}") from None
        call_command("migrate", interactive=False, verbosity=0)
        experiment = self._demo_account()
        children = self._start(opts["host"], opts["port"])
        try:
            url = f"http://{opts['host']}:{opts['port']}/"
            self._wait_http(url + "api/schema/", children)
            mode = "service" if os.environ.get("DATABASE_URL") else "embedded"
            self.stdout.write(self.style.SUCCESS(f"Gyre is up ({mode} mode): {url}"))
            self.stdout.write(f"Log in as {DEMO_USER} / {DEMO_PASSWORD}. Ctrl-C stops everything.")
            if opts["no_run"]:
                self._serve(children)
                return
            try:  # what the config names is the platform's rule (docs/platform.md)
                run = services.create_run(experiment=experiment, config=config, name="demo")
            except services.ConfigInvalid as err:
                raise CommandError(f"{opts['config']}: {err}") from None
            self.stdout.write(f"Demo run {run.pk} ({run.policy}): {url}runs/{run.pk}")
            status = self._follow(run.pk, children)
            if status != "succeeded":
                raise CommandError(f"demo run {run.pk} ended {status}")
            if not opts["exit_when_done"]:
                self._serve(children)
        except (_Stop, KeyboardInterrupt):
            self.stdout.write("stopping")
        finally:
            _stop_all(children)

    def _demo_account(self) -> Experiment:
        User = get_user_model()
        user = User.objects.filter(username=DEMO_USER).first()
        if user is None:
            user = User.objects.create_user(DEMO_USER, password=DEMO_PASSWORD)
        team = Team.objects.filter(name=DEMO_TEAM).first() or create_team(
            name=DEMO_TEAM, owner=user
        )
        exp = Experiment.objects.filter(team=team, name="CPU demo").first()
        return exp or services.create_experiment(
            team=team,
            name="CPU demo",
            created_by=user,
            description="A tiny Qwen3 learning the long-horizon repo suite on Ray units",
        )

    def _start(self, host: str, port: int) -> list[subprocess.Popen[bytes]]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)])}
        env.setdefault("DJANGO_SETTINGS_MODULE", settings.SETTINGS_MODULE)
        logs = Path(settings.GYRE_DATA_DIR) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        py = sys.executable
        cmds = {
            "web": [py, "-m", "daphne", "-b", host, "-p", str(port), "gyre_web.asgi:application"],
            "worker": [
                py,
                "-m",
                "celery",
                "-A",
                "workers.celery_app",
                "worker",
                "-P",
                "solo",
                "-c",
                "1",
                "-l",
                "warning",
            ],
        }
        children = []
        for name, cmd in cmds.items():
            log = open(logs / f"{name}.log", "ab")  # noqa: SIM115 (the child holds it)
            children.append(
                subprocess.Popen(
                    cmd, cwd=REPO, env=env, stdout=log, stderr=log, start_new_session=True
                )
            )
            self.stdout.write(f"started {name} (pid {children[-1].pid}, log {logs / name}.log)")
        return children

    def _wait_http(self, url: str, children: list[subprocess.Popen[bytes]]) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            _check_alive(children)
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise CommandError(f"the web server did not answer {url} within 120 s")

    def _follow(self, run_id: int, children: list[subprocess.Popen[bytes]]) -> str:
        seq = 0
        while True:
            _check_alive(children)
            for ev in RunEvent.objects.filter(run_id=run_id, seq__gt=seq).order_by("seq")[:500]:
                seq = ev.seq
                line = _describe(ev.kind, ev.data)
                if line:
                    self.stdout.write(f"[run {run_id}] {line}")
            status = Run.objects.values_list("status", flat=True).get(pk=run_id)
            if status in TERMINAL and not RunEvent.objects.filter(run_id=run_id, seq__gt=seq):
                return str(status)
            time.sleep(0.5)

    def _serve(self, children: list[subprocess.Popen[bytes]]) -> None:
        while True:
            _check_alive(children)
            time.sleep(1)


def _describe(kind: str, data: dict[str, Any]) -> str:
    if kind == "run_status":
        return f"status {data.get('status')} {data.get('message', '')}".rstrip()
    if kind == "step_finished":
        m = data.get("metrics", {})
        return (
            f"step {data.get('step')}: reward {m.get('reward', 0):.3f}, "
            f"loss {m.get('loss', 0):.4f}, dedup {m.get('dedup_ratio', 0):.2f}x"
        )
    if kind == "benchmark":
        k = int(data.get("samples") or 0)
        how = f"{k} sampled sessions a task" if k else "greedy"
        return (
            f"benchmark {data.get('suite')} at step {data.get('step')}: {data.get('score')} ({how})"
        )
    if kind == "role_change" and data.get("to_role") != "switching":
        return f"unit {data.get('unit')}: {data.get('from_role')} -> {data.get('to_role')}"
    if kind == "phase_progress":  # model build, engine start, warm start, benchmark
        return PhaseProgress(t=0.0, **data).line()
    if kind == "call_migrated":
        return f"call of {data.get('rollout_id')} migrated, {data.get('tokens_kept')} tokens kept"
    return ""


def _check_alive(children: list[subprocess.Popen[bytes]]) -> None:
    for c in children:
        if c.poll() is not None:
            raise CommandError(
                f"{' '.join(c.args[2:4])} exited with code {c.returncode} (see .data/logs/)"
            )


def _stop_all(children: list[subprocess.Popen[bytes]]) -> None:
    for c in children:
        if c.poll() is None:
            os.killpg(c.pid, signal.SIGTERM)
    for c in children:
        try:
            c.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(c.pid, signal.SIGKILL)
            c.wait()
