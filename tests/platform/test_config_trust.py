"""What a web config may name (docs/platform.md): code only from the operator's allow-list,
files only as the team's objects or under the operator's roots, addresses only as the
operator's settings; everything else 400 by field, through every door (create, fork,
sweep, resume), as a plain member with external agents off."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from gyre_web.runs import services
from gyre_web.runs.exports import export_dir
from gyre_web.runs.models import CheckpointExport, Experiment, ExportStatus, Run, Status

from gyre_core.config import RunConfig, config_schema

ROOT = Path(__file__).resolve().parents[2]
CODE = [("rollout", "env", "subprocess:Popen"), ("rollout", "reward_fn", "os:system")]
FILES = ["rollout.tasks", "model.checkpoint", "warm_start.weights", "warm_start.data",
         "train.offpolicy_data", "warm_start.cache"]  # fmt: skip


@pytest.fixture(autouse=True)
def defaults(settings, monkeypatch):
    """The operator's defaults, run from the repository root as the web and workers are."""
    monkeypatch.chdir(ROOT)
    settings.GYRE_EXTERNAL_AGENTS = False
    settings.GYRE_PLUGINS = ()
    settings.RAY_ADDRESS = ""
    settings.GYRE_MLFLOW_TRACKING_URI = ""


@pytest.fixture
def exp(people):
    return services.create_experiment(team=people["team"], name="trust")


def _policy() -> Any:
    from gyre_web.runs import config_policy  # here: each test fails alone on older code

    return config_policy


def _nested(field: str, value: Any) -> dict[str, Any]:
    section, _, name = field.partition(".")
    return {section: {name: value}}


def _with(config: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    return services.deep_merge(config, _nested(field, value))


def _post(client: Any, exp: Any, config: dict[str, Any]) -> Any:
    return client.post("/api/runs/", {"experiment": exp.pk, "config": config}, format="json")


def _refused(resp: Any, field: str, key: str = "config") -> str:
    assert resp.status_code == 400, resp.content
    assert list(resp.json()[key]) == [field], resp.json()
    return str(resp.json()[key][field])


@pytest.mark.parametrize("agents", [False, True])
@pytest.mark.parametrize(("section", "name", "value"), CODE)
def test_code_outside_the_allow_list_is_refused_through_every_door(
    people, exp, sim_config, client_for, section, name, value, agents, settings
):
    settings.GYRE_EXTERNAL_AGENTS = agents  # the agents flag does not open plugins
    field = f"{section}.{name}"
    member = client_for(people["member"])
    bad = _with(sim_config, field, value)
    assert "GYRE_PLUGINS" in _refused(_post(member, exp, bad), field)
    parent = services.create_run(experiment=exp, config=sim_config, launch=False)
    fork = member.post(f"/api/runs/{parent.pk}/fork/", {"changes": _nested(field, value)},
                       format="json")  # fmt: skip
    _refused(fork, field)
    sweep = {"experiment": exp.pk, "base_config": sim_config, "mode": "grid",
             "params": {field: [value]}, "max_concurrent": 1}  # fmt: skip
    resp = member.post("/api/sweeps/", sweep, format="json")
    assert resp.status_code == 400 and f'params["{field}"]' in resp.json(), resp.content
    resp = member.post("/api/sweeps/", {**sweep, "base_config": bad, "params": {"seed": [1]}},
                       format="json")  # fmt: skip
    _refused(resp, field, "base_config")
    assert list(Run.objects.values_list("pk", flat=True)) == [parent.pk]  # nothing else made


def test_code_the_operator_lists_passes(people, exp, sim_config, client_for, settings):
    member = client_for(people["member"])
    env, reward = "tests.rollout.plugins.word_env:WordEnv", "tests.rollout.plugins.word_env:reward"
    config = _with(_with(sim_config, "rollout.env", env), "rollout.reward_fn", reward)
    assert _post(member, exp, config).status_code == 400
    settings.GYRE_PLUGINS = (env, reward)
    made = _post(member, exp, config)
    assert made.status_code == 201, made.content
    assert made.json()["config"]["rollout"]["env"] == env


def test_an_installed_gyre_plugins_entry_point_is_allowed(
    people, exp, sim_config, client_for, tmp_path, monkeypatch
):
    """A package that declares ``[gyre.plugins]`` entry points: a dist-info on sys.path."""
    info = tmp_path / "gyre_word_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gyre-word-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[gyre.plugins]\nword = tests.rollout.plugins.word_env:WordEnv\n"
    )
    config = _with(sim_config, "rollout.env", "tests.rollout.plugins.word_env:WordEnv")
    member = client_for(people["member"])
    assert _post(member, exp, config).status_code == 400
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "tests.rollout.plugins.word_env:WordEnv" in _policy().plugins()
    assert _post(member, exp, config).status_code == 201


def test_an_agent_when_allowed_is_code_from_the_allow_list(
    people, exp, sim_config, client_for, settings
):
    member = client_for(people["member"])
    config = _with(sim_config, "rollout.agent", "os:system")
    assert "GYRE_EXTERNAL_AGENTS" in _refused(_post(member, exp, config), "rollout.agent")
    settings.GYRE_EXTERNAL_AGENTS = True
    assert "GYRE_PLUGINS" in _refused(_post(member, exp, config), "rollout.agent")
    settings.GYRE_PLUGINS = ("os:system",)
    assert _post(member, exp, config).status_code == 201


@pytest.mark.parametrize("field", FILES)
def test_a_server_path_is_refused_by_field(
    people, exp, sim_config, client_for, field, tmp_path, settings
):
    member = client_for(people["member"])
    theirs = services.create_experiment(team=people["other_team"], name="theirs")
    their_run = services.create_run(experiment=theirs, config=sim_config, launch=False)
    root = tmp_path / "root"
    root.mkdir()
    (root / "escape").symlink_to("/etc/passwd")
    settings.GYRE_DATA_ROOTS = [root]
    settings.GYRE_CACHE_ROOTS = [root]
    for value in ("/etc/passwd", str(services.run_dir(their_run.pk) / "checkpoints"),
                  str(root / "escape"), f"{root}/../../etc", "configs/../.data/runs",
                  "dataset:999999", "checkpoint:1", "/etc/passwd\x00x"):  # fmt: skip
        config = _with(sim_config, field, value)
        _refused(_post(member, exp, config), field)
    assert not Run.objects.filter(experiment=exp).exists()


@pytest.mark.parametrize("field", FILES)
def test_a_path_under_an_operator_root_passes(
    people, exp, sim_config, client_for, field, tmp_path, settings
):
    settings.GYRE_DATA_ROOTS = [tmp_path / "data"]
    settings.GYRE_CACHE_ROOTS = [tmp_path / "data"]
    value = str(tmp_path / "data" / "sub" / "file")
    made = _post(client_for(people["member"]), exp, _with(sim_config, field, value))
    assert made.status_code == 201, made.content


def test_a_checkpoint_is_named_by_run_and_version_and_checked_against_the_reader(
    people, exp, sim_config, client_for
):
    member = client_for(people["member"])
    theirs = services.create_experiment(team=people["other_team"], name="theirs")
    ours = services.create_run(experiment=exp, config=sim_config, launch=False)
    their = services.create_run(experiment=theirs, config=sim_config, launch=False)
    for run in (ours, their):
        CheckpointExport.objects.create(run=run, version=4, status=ExportStatus.DONE)
        export_dir(run.pk, 4).mkdir(parents=True)
    refused = _refused(_post(member, exp, _with(sim_config, "model.checkpoint",
                                                f"checkpoint:{their.pk}@4")), "model.checkpoint")  # fmt: skip
    assert "has no launched run" in refused
    # a public experiment shows its runs to outsiders, never its weights
    Experiment.objects.filter(pk=theirs.pk).update(visibility="public")
    assert member.get(f"/api/runs/{their.pk}/").status_code == 200
    _refused(_post(member, exp, _with(sim_config, "model.checkpoint", f"checkpoint:{their.pk}@4")),
             "model.checkpoint")  # fmt: skip
    _refused(_post(member, exp, _with(sim_config, "model.checkpoint", f"checkpoint:{ours.pk}@3")),
             "model.checkpoint")  # fmt: skip
    _refused(_post(member, exp, _with(sim_config, "warm_start.weights", f"checkpoint:{ours.pk}")),
             "warm_start.weights")  # fmt: skip
    for value in (f"checkpoint:{ours.pk}@4", f"checkpoint:{ours.pk}"):
        made = _post(member, exp, _with(sim_config, "model.checkpoint", value))
        assert made.status_code == 201, made.content
        assert made.json()["config"]["model"]["checkpoint"] == value  # stored as named
        run = Run.objects.get(pk=made.json()["id"])
        assert services.runnable_config(run).model.checkpoint == str(export_dir(ours.pk, 4))


@pytest.mark.parametrize(
    ("field", "setting", "value"),
    [("cluster.ray_address", "RAY_ADDRESS", "10.0.0.9:6379"),
     ("tracking.mlflow_tracking_uri", "GYRE_MLFLOW_TRACKING_URI", "file:///etc")],
)  # fmt: skip
def test_an_address_is_the_operators(
    people, exp, sim_config, client_for, settings, field, setting, value
):
    member = client_for(people["member"])
    assert setting in _refused(_post(member, exp, _with(sim_config, field, value)), field)
    mine = "ray-head:6379" if setting == "RAY_ADDRESS" else "http://mlflow.internal:5000"
    setattr(settings, setting, mine)
    _refused(_post(member, exp, _with(sim_config, field, value)), field)
    for named in (mine, ""):
        made = _post(member, exp, _with(sim_config, field, named))
        assert made.status_code == 201, made.content
        cfg = services.runnable_config(Run.objects.get(pk=made.json()["id"]))
        assert _policy()._get(cfg, field) == mine  # the worker runs the operator's


def test_a_reported_run_names_its_own_paths_but_a_fork_of_it_is_checked(
    people, exp, sim_config, client_for
):
    """A run reported from a terminal runs there: its paths are its reporter's. Forked, it
    runs here, and the whole merged config is checked."""
    member = client_for(people["member"])
    config = _with(sim_config, "model.checkpoint", "/home/me/model")
    made = member.post("/api/runs/report/", {"experiment": exp.pk, "config": config},
                       format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    fork = member.post(f"/api/runs/{made.json()['id']}/fork/", {"changes": {"seed": 3}},
                       format="json")  # fmt: skip
    _refused(fork, "model.checkpoint")


def test_a_resume_is_checked_again(people, exp, sim_config, client_for):
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    stored = _with(sim_config, "rollout.env", "subprocess:Popen")
    Run.objects.filter(pk=run.pk).update(config=stored, status=Status.FAILED)
    resp = client_for(people["member"]).post(f"/api/runs/{run.pk}/resume/")
    _refused(resp, "rollout.env")
    assert Run.objects.get(pk=run.pk).status == Status.FAILED


def test_the_shipped_configs_the_platform_offers_pass_with_default_settings(
    people, exp, client_for
):
    member = client_for(people["member"])
    presets = member.get("/api/config/presets/").json()["presets"]
    assert {"demo", "learn-elastic"} <= set(presets)
    for name, config in presets.items():
        made = _post(member, exp, copy.deepcopy(config))
        assert made.status_code == 201, (name, made.content)
        cfg = services.runnable_config(Run.objects.get(pk=made.json()["id"]))
        for field in ("warm_start.weights", "warm_start.cache"):
            value = _policy()._get(cfg, field)
            assert not value or Path(value).is_absolute()  # what the worker runs


def test_the_shipped_configs_pass_as_gyre_demo_loads_them(people, exp):
    """``manage.py gyre_demo --config`` reads a file (its relative paths made absolute)."""
    from gyre_core.config import load_config

    for path in sorted((ROOT / "configs").glob("*.yaml")):
        config = load_config(path).to_dict()
        run = services.create_run(experiment=exp, config=config, launch=False)
        want = load_config(path)
        got = services.runnable_config(run)
        assert (got.train, got.warm_start) == (want.train, want.warm_start), path


def test_every_free_text_field_of_the_config_is_classified():
    """A new string field is code, a path, an address or a label: the policy says which."""
    config_policy = _policy()
    known = {*config_policy.CODE, *config_policy.AGENTS, *config_policy.READ,
             *config_policy.WRITE, *config_policy.ADDRESSES, *config_policy.FREE}  # fmt: skip
    free = {k for k, v in config_schema().items() if v["type"] == "str" and "choices" not in v}
    assert free == known
    paths = {f"{sec}.{name}" for sec, name in _path_fields(RunConfig)}
    assert paths == set(config_policy.READ) | set(config_policy.WRITE)


def _path_fields(cls: Any) -> list[tuple[str, str]]:
    from dataclasses import MISSING, fields

    out = []
    for sec in fields(cls):
        if sec.default is MISSING:
            out += [(sec.name, f.name) for f in fields(sec.default_factory())  # type: ignore[misc]
                    if f.metadata.get("path")]  # fmt: skip
    return out


def test_the_settings_fail_fast_and_read_their_lists(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured
    from gyre_web.settings import trust

    monkeypatch.setenv("GYRE_PLUGINS", "pkg.mod:Env, other:fn")
    assert trust._plugins("GYRE_PLUGINS", trust.env_list("GYRE_PLUGINS", [])) == (
        "pkg.mod:Env",
        "other:fn",
    )
    with pytest.raises(ImproperlyConfigured, match="GYRE_PLUGINS: 'rm -rf /' is not an import"):
        trust._plugins("GYRE_PLUGINS", ["pkg.mod:Env", "rm -rf /"])
    assert trust._roots(["configs", "/srv/data"], []) == (ROOT / "configs", Path("/srv/data"))
    assert trust._roots([], [ROOT / "configs"]) == (ROOT / "configs",)


def test_a_dataset_is_named_by_id_and_only_its_teams(people, exp, sim_config, client_for):
    from django.core.files.uploadedfile import SimpleUploadedFile

    def upload(user: str, team: Any, kind: str, data: bytes) -> int:
        body = {"file": SimpleUploadedFile("d.jsonl", data), "name": "d", "kind": kind,
                "team": team.pk}  # fmt: skip
        resp = client_for(people[user]).post("/api/datasets/", body, format="multipart")
        assert resp.status_code == 201, resp.content
        return int(resp.json()["id"])

    tasks = upload("member", people["team"], "tasks", b'{"id": "t1", "prompt": "add"}\n')
    theirs = upload("outsider", people["other_team"], "tasks", b'{"id": "t9", "prompt": "x"}\n')
    member = client_for(people["member"])
    _refused(_post(member, exp, _with(sim_config, "rollout.tasks", f"dataset:{theirs}")),
             "rollout.tasks")  # fmt: skip
    _refused(
        _post(member, exp, _with(sim_config, "train.offpolicy_data", f"dataset:{tasks}")),
        "train.offpolicy_data",
    )  # fmt: skip: a task list is no trajectory file
    made = _post(member, exp, _with(sim_config, "rollout.tasks", f"dataset:{tasks}"))
    assert made.status_code == 201, made.content
    assert made.json()["config"]["rollout"]["tasks"] == f"dataset:{tasks}"  # no server path
    run = Run.objects.get(pk=made.json()["id"])
    path = Path(services.runnable_config(run).rollout.tasks)
    assert path.read_bytes() == b'{"id": "t1", "prompt": "add"}\n'  # what the worker reads


def test_an_old_warm_start_field_is_refused_with_its_new_name(people, exp, sim_config, client_for):
    member = client_for(people["member"])
    old = _with(sim_config, "train.warm_start_from", "configs/warm-start/x.safetensors")
    problem = _refused(_post(member, exp, old), "train.warm_start_from")
    assert "moved to warm_start.weights" in problem
    assert not Run.objects.filter(experiment=exp).exists()


def test_stored_configs_move_their_warm_start_fields() -> None:
    """Runs stored before the ``warm_start`` section (every field of ``train``, as
    ``RunConfig.to_dict`` wrote them) run, resume and fork after the migration."""
    import importlib

    runs = importlib.import_module("gyre_web.runs.migrations.0009_warm_start_section")
    sweeps = importlib.import_module("gyre_web.sweeps.migrations.0002_warm_start_section")
    from gyre_core.config import ConfigError

    new = RunConfig.from_dict({"warm_start": {"steps": 5, "weights": "w.safetensors"}}).to_dict()
    stored = runs.back(new)  # the layout before
    assert stored["train"]["warm_start_from"] == "w.safetensors" and "warm_start" not in stored
    with pytest.raises(ConfigError, match=r"moved to warm_start\.steps"):
        RunConfig.from_dict(stored)
    assert runs.moved(stored) == new and RunConfig.from_dict(runs.moved(stored)).to_dict() == new
    assert runs.moved(new) is new  # a config of the new layout is left as it is
    base = {"train": {"lr": 1e-3, "warm_start_from": "w"}}
    assert sweeps._config(base, sweeps.PATHS) == {
        "train": {"lr": 1e-3},
        "warm_start": {"weights": "w"},
    }
    params = {"train.warm_start_lr": [0.1, 0.01], "train.lr": [1e-3]}
    assert sweeps._keys(params, sweeps.PATHS) == {"warm_start.lr": [0.1, 0.01], "train.lr": [1e-3]}


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_a_stored_runs_warm_start_fields(people) -> None:
    """A run stored before the ``warm_start`` section resumes after the migration: its
    config moves, as a sweep's base config, swept paths and values do."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before = [("runs", "0008_checkpoint_exports"), ("sweeps", "0001_initial")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    exp = old.get_model("runs", "Experiment").objects.create(team_id=people["team"].pk, name="m")
    d = RunConfig.from_dict({"warm_start": {"steps": 5, "lr": 0.01}}).to_dict()
    stored = {**{k: v for k, v in d.items() if k != "warm_start"},
              "train": {**d["train"], **{f"warm_start_{'from' if k == 'weights' else k}": v
                                         for k, v in d["warm_start"].items()}}}  # fmt: skip
    run = old.get_model("runs", "Run").objects.create(
        experiment=exp, config=stored, policy="elastic", backend="real"
    )
    sweep = old.get_model("sweeps", "Sweep").objects.create(
        experiment=exp, base_config={"train": {"warm_start_from": "w"}}, mode="grid",
        params={"train.warm_start_lr": [0.1]}, max_concurrent=1,
    )  # fmt: skip
    old.get_model("sweeps", "SweepRun").objects.create(
        sweep=sweep, run=run, index=0, values={"train.warm_start_lr": 0.1}
    )
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    from gyre_web.sweeps.models import Sweep, SweepRun

    assert Run.objects.get(pk=run.pk).config == d
    assert RunConfig.from_dict(Run.objects.get(pk=run.pk).config).warm_start.steps == 5
    s = Sweep.objects.get(pk=sweep.pk)
    assert (s.base_config, s.params) == ({"train": {}, "warm_start": {"weights": "w"}},
                                         {"warm_start.lr": [0.1]})  # fmt: skip
    assert SweepRun.objects.get(sweep=s).values == {"warm_start.lr": 0.1}
