"""deploy/ as far as a machine without Docker or Kubernetes can check it: every YAML parses,
every file, module and command the deployment files name exists, their environment
variables match docs/configuration.md (and that page lists only variables the code reads),
the systemd units are complete, and the KubeRay cluster asks for GPUs."""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
K8S = sorted((DEPLOY / "k8s").glob("*.yaml"))
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
ENV_EXAMPLE = DEPLOY / "systemd" / "gyre.env.example"
CONFIG_DOC = ROOT / "docs" / "configuration.md"
DEPLOY_FILES = [COMPOSE, DOCKERFILE, *K8S, *UNITS, ENV_EXAMPLE]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

NAME = r"[A-Z][A-Z0-9_]*[A-Z0-9]"
# $NAME, ${NAME}, ${NAME:-default}, $(NAME) (Kubernetes) in commands and values.
REF = re.compile(r"\$[({]?(" + NAME + r")")
# Where the code reads a variable (the product code: gyre_core, platform, workers).
READ = re.compile(
    r"(?:env_str|env_bool|env_float|env_list|environ\.get|environ\.setdefault|getenv)"
    r"\(\s*[\"'](" + NAME + r")[\"']|environ\[[\"'](" + NAME + r")[\"']\]"
)
# Python modules the deployment files run: gyre_web.asgi:application, workers.celery_app...
MODULE = re.compile(r"\b((?:gyre_web|workers|gyre_core)(?:\.[a-z_]+)+)(?::([a-z_]+))?")


def k8s_docs() -> list[dict[str, Any]]:
    return [doc for path in K8S for doc in yaml.safe_load_all(path.read_text()) if doc]


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def walk(node: Any):
    """Every dict inside a parsed YAML document."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for d in walk(doc) for key in ("containers", "initContainers")
            for c in d.get(key, []) if isinstance(c, dict)]  # fmt: skip


def code_files() -> list[Path]:
    files = [ROOT / "manage.py", ROOT / "Makefile"]
    for folder in ("gyre_core", "platform", "workers", "tests"):
        files += (ROOT / folder).rglob("*.py")
    return [f for f in files if DEPLOY.name not in f.relative_to(ROOT).parts[:2]]


# ---------------------------------------------------------------------- the reference


def documented() -> tuple[set[str], set[str]]:
    """(variables in the table, variables of other programs named below it)."""
    text = CONFIG_DOC.read_text()
    table = set(re.findall(r"^\| `(" + NAME + r")` \|", text, flags=re.M))
    others = text.split("**Variables of other programs.**", 1)[1].split("\n\n", 1)[0]
    return table, set(re.findall(r"`(" + NAME + r")`", others))


def named_in_deploy() -> dict[str, set[str]]:
    """Environment variables each deployment file sets or refers to."""
    found: dict[str, set[str]] = {}
    for path in DEPLOY_FILES:
        text = path.read_text()
        names = set(REF.findall(text))
        if path == DOCKERFILE:
            names -= set(re.findall(r"^ARG (" + NAME + ")", text, flags=re.M))
            for instr in re.findall(r"^ENV ((?:.*\\\n)*.*)", text, flags=re.M):
                names |= set(re.findall(r"(" + NAME + r")=", instr))
        elif path == ENV_EXAMPLE:
            names |= set(re.findall(r"^(" + NAME + r")=", text, flags=re.M))
        elif path.suffix == ".service":
            names |= set(re.findall(r"^Environment=(" + NAME + r")=", text, flags=re.M))
        else:
            docs = [compose()] if path == COMPOSE else list(yaml.safe_load_all(text))
            for d in (d for doc in docs for d in walk(doc)):
                env = d.get("environment")
                if isinstance(env, dict):
                    names |= set(env)
                if d.get("kind") in ("ConfigMap", "Secret"):
                    names |= set(d.get("data") or {}) | set(d.get("stringData") or {})
                for item in d.get("env") or []:
                    names.add(item["name"])
        found[path.relative_to(ROOT).as_posix()] = names
    return found


def test_reference_table_is_well_formed():
    table, others = documented()
    assert {"DATABASE_URL", "REDIS_URL", "GYRE_SECRET_KEY", "RAY_ADDRESS", "GYRE_VLLM_VENV",
            "GYRE_REQUIRE_VLLM", "RAY_AUTH_MODE", "HF_HUB_OFFLINE"} <= table  # fmt: skip
    assert not table & others
    rows = [line for line in CONFIG_DOC.read_text().splitlines() if line.startswith("| `")]
    assert len(rows) == len(table), "a variable is listed twice"
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4 and all(cells), f"name, default, what, read by: {row}"


def test_every_variable_in_deploy_files_is_documented():
    table, others = documented()
    missing = {path: sorted(names - table - others)
               for path, names in named_in_deploy().items() if names - table - others}  # fmt: skip
    assert not missing, f"not in docs/configuration.md: {missing}"


def test_every_documented_variable_is_read_by_the_code():
    table, _ = documented()
    code = "\n".join(f.read_text() for f in code_files())
    unread = sorted(name for name in table if not re.search(rf"\b{name}\b", code))
    assert not unread, f"docs/configuration.md lists variables no code reads: {unread}"


def test_every_variable_the_code_reads_is_documented():
    table, _ = documented()
    read: dict[str, str] = {}
    for folder in ("gyre_core", "platform", "workers"):
        for path in (ROOT / folder).rglob("*.py"):
            for match in READ.finditer(path.read_text()):
                read.setdefault(match.group(1) or match.group(2), str(path.relative_to(ROOT)))
    assert "DATABASE_URL" in read and "RAY_ADDRESS" in read  # the scan finds reads
    missing = {name: where for name, where in read.items() if name not in table}
    assert not missing, f"read by the code, missing from docs/configuration.md: {missing}"


# ---------------------------------------------------------------------- paths and commands


def test_dockerfile_copies_files_that_exist():
    text = DOCKERFILE.read_text()
    sources = []
    for args in re.findall(r"^COPY (.+)$", text, flags=re.M):
        parts = args.split()
        if any(p.startswith("--from") for p in parts):
            continue
        sources += [p for p in parts[:-1] if not p.startswith("--")]
    assert "manage.py" in sources and "platform/" in sources and "workers/" in sources
    missing = [s for s in sources if not (ROOT / s).exists()]
    assert not missing, f"Dockerfile COPYs what the repository lacks: {missing}"
    ignore = DOCKERFILE.with_name("Dockerfile.dockerignore").read_text().split()
    assert not set(sources) & set(ignore)


def test_modules_and_manage_py_named_in_deploy_files_exist():
    seen = set()
    for path in [*DEPLOY_FILES, DEPLOY / "README.md"]:
        for module, attr in MODULE.findall(path.read_text()):
            base = ROOT / "platform" if module.startswith("gyre_web") else ROOT
            stem = base.joinpath(*module.split("."))
            source = (
                stem.with_suffix(".py")
                if stem.with_suffix(".py").exists()
                else stem / "__init__.py"
            )
            assert source.exists(), f"{path.name} names {module}, which does not exist"
            if attr:
                assert re.search(rf"^{attr}\b", source.read_text(), flags=re.M), (
                    f"{path.name}: {module} defines no {attr}"
                )
            seen.add(f"{module}:{attr}" if attr else module)
        if "manage.py" in path.read_text():
            assert (ROOT / "manage.py").exists()
    assert {"gyre_web.asgi:application", "workers.celery_app"} <= seen


def commands() -> list[tuple[str, str]]:
    """(where, command line) for every command the deployment runs in the Gyre image."""
    found = []
    for name, svc in compose()["services"].items():
        cmd = svc.get("command")
        if cmd and svc.get("image", "").startswith("gyre:"):
            found.append((f"compose {name}", cmd if isinstance(cmd, str) else " ".join(cmd)))
    for doc in k8s_docs():
        for c in containers(doc):
            if "command" in c:
                found.append((f"k8s {c['name']}", " ".join(c["command"])))
    for unit in UNITS:
        for line in re.findall(r"^Exec\w+=(.+)$", unit.read_text(), flags=re.M):
            found.append((unit.name, line))
    cmd = re.search(r"^CMD (.+)$", DOCKERFILE.read_text(), flags=re.M)
    assert cmd is not None
    found.append(("Dockerfile CMD", " ".join(yaml.safe_load(cmd.group(1)))))
    return found


def test_every_program_the_deployment_runs_is_installed():
    """daphne, celery, ray, python: console scripts of this project's environment."""
    venv_bin = Path(sys.executable).parent
    programs = set()
    for where, line in commands():
        for step in re.split(r"&&|-c ", line):
            words = step.split()
            if words and words[0] == "exec":
                words = words[1:]
            if words:
                programs.add((where, Path(words[0]).name))
    assert {p for _, p in programs} >= {"daphne", "celery", "ray", "python"}
    for where, program in programs:
        if program in ("sh", "python"):
            continue
        assert (venv_bin / program).exists(), f"{where} runs {program}, not installed"


def test_web_migrates_before_serving_and_worker_joins_ray_first():
    for where, line in commands():
        if "daphne" in line and "&&" in line:
            assert line.index("migrate") < line.index("daphne"), where
        if "celery" in line and "worker" in line and "ray start" in line:
            assert line.index("ray start") < line.index("celery"), where


# ---------------------------------------------------------------------- compose


def test_compose_services_healthchecks_and_environment():
    services = compose()["services"]
    assert {"postgres", "redis", "web", "worker", "beat", "ray-head", "ray-worker"} <= set(services)
    for name, svc in services.items():
        assert "healthcheck" in svc, f"{name} has no healthcheck"
    for name in ("web", "worker", "beat", "ray-head", "ray-worker"):
        env = services[name]["environment"]
        assert {"DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "GYRE_SECRET_KEY"} <= set(env)
        assert env["RAY_ADDRESS"] == "ray-head:6379"
        assert services[name]["image"] == f"gyre:{VERSION}"
    build = services["web"]["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    assert "gpu_unit" in " ".join(services["ray-worker"]["command"])
    assert services["web"]["ports"] == ["8000:8000"]


def test_compose_commented_gpu_worker_is_valid():
    """Uncommented, the GPU variant is a valid service (merged with the x-gyre defaults)."""
    text = COMPOSE.read_text()
    lines = text.splitlines()
    start = lines.index("  # ray-gpu-worker:")
    block = []
    for line in lines[start:]:
        if not line.startswith("  #"):
            break
        block.append("  " + line[4:])
    head = text[: text.index("\nservices:")]
    doc = yaml.safe_load(head + "\nservices:\n" + "\n".join(block))
    gpu = doc["services"]["ray-gpu-worker"]
    assert gpu["environment"]["RAY_ADDRESS"] == "ray-head:6379"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert gpu["build"]["args"]["GPU"] == "1"
    assert "--num-gpus=8" in gpu["command"] and '--resources={"gpu_unit": 8}' in gpu["command"]


def _has_compose() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not _has_compose(), reason="docker compose is not installed")
def test_docker_compose_config_accepts_the_file():
    env = {"GYRE_SECRET_KEY": "x" * 40, "PATH": "/usr/bin:/bin:/usr/local/bin"}
    result = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "-q"],
                            capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------- kubernetes


def test_k8s_manifests_parse_and_cover_the_platform():
    docs = k8s_docs()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Namespace", "gyre"), ("ConfigMap", "gyre-config"), ("Secret", "gyre-secrets"),
            ("Deployment", "gyre-web"), ("Deployment", "gyre-worker"), ("Service", "gyre-web"),
            ("RayCluster", "gyre-ray"), ("Ingress", "gyre")} <= kinds  # fmt: skip
    for doc in docs:
        assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "gyre"
        for c in containers(doc):
            assert c["image"] in (f"gyre:{VERSION}", f"gyre:{VERSION}-gpu"), c["image"]
    settings = {k for d in docs if d["kind"] in ("ConfigMap", "Secret")
                for k in {**d.get("data", {}), **d.get("stringData", {})}}  # fmt: skip
    assert {"DATABASE_URL", "REDIS_URL", "GYRE_SECRET_KEY", "RAY_ADDRESS"} <= settings
    web = next(d for d in docs if d["metadata"]["name"] == "gyre-web" and d["kind"] == "Deployment")
    spec = web["spec"]["template"]["spec"]
    assert spec["initContainers"][0]["command"][-2:] == ["migrate", "--noinput"]
    probes = spec["containers"][0]
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["selector"] == web["spec"]["selector"]["matchLabels"]
    ingress = next(d for d in docs if d["kind"] == "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]


def test_raycluster_has_a_head_and_a_gpu_worker_group():
    cluster = next(d for d in k8s_docs() if d["kind"] == "RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1"
    head = cluster["spec"]["headGroupSpec"]
    assert head["template"]["spec"]["containers"] and "rayStartParams" in head
    config = next(d for d in k8s_docs() if d["kind"] == "ConfigMap")
    # KubeRay names the head service <name>-head-svc: that is the address to join.
    assert config["data"]["RAY_ADDRESS"].startswith(f"{cluster['metadata']['name']}-head-svc.")
    groups = cluster["spec"]["workerGroupSpecs"]
    gpu_groups = 0
    for group in groups:
        params = group["rayStartParams"]
        assert all(isinstance(v, str) for v in params.values()), "rayStartParams are strings"
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        gpus = int(limits.get("nvidia.com/gpu", 0))
        if gpus:
            gpu_groups += 1
            assert int(params["num-gpus"]) == gpus
            units = yaml.safe_load(yaml.safe_load(params["resources"]))
            assert units == {"gpu_unit": gpus}, "advertise gpu_unit = GPUs of the pod"
    assert gpu_groups >= 1


# ---------------------------------------------------------------------- systemd


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_unit_is_complete(unit: Path):
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(unit.read_text())
    assert {"Unit", "Service", "Install"} <= set(parser.sections())
    service = parser["Service"]
    assert service["ExecStart"].startswith("/opt/gyre/.venv/bin/"), "absolute ExecStart"
    assert service["EnvironmentFile"] == "/etc/gyre/gyre.env"
    assert service["WorkingDirectory"] == "/opt/gyre"
    assert parser["Install"]["WantedBy"] == "multi-user.target"
    for other in re.findall(r"gyre-[a-z-]+\.service", parser["Unit"].get("After", "")):
        assert (unit.parent / other).exists(), f"{unit.name} orders after missing {other}"


def test_systemd_covers_every_process():
    names = {u.name for u in UNITS}
    assert {"gyre-web.service", "gyre-worker.service", "gyre-ray-head.service",
            "gyre-ray-worker.service"} <= names  # fmt: skip
    example = dict(
        line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
        if line and not line.startswith("#")
    )  # fmt: skip
    assert {"DATABASE_URL", "REDIS_URL", "GYRE_SECRET_KEY", "RAY_ADDRESS"} <= set(example)
    assert example["PYTHONPATH"].split(":")[0] == "/opt/gyre/platform"


# ---------------------------------------------------------------------- user and folders


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for instr in re.findall(r"^ENV ((?:.*\\\n)*.*)", DOCKERFILE.read_text(), flags=re.M):
        env.update(re.findall(r"(" + NAME + r")=(\S+)", instr))
    return env


WRITABLE = ("TMPDIR", "XDG_CACHE_HOME", "HF_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def test_the_image_runs_as_a_non_root_user_owning_its_writable_folders():
    """uid 1000 (the pods' runAsUser), every folder a process writes under GYRE_DATA_DIR,
    made and handed to that user after the build, so that a pod's first write lands."""
    text = DOCKERFILE.read_text()
    assert re.search(r"useradd [^\n]*--uid 1000 gyre", text)
    assert re.findall(r"^USER (\S+)", text, flags=re.M)[-1] == "gyre"
    env = image_env()
    data = Path(env["GYRE_DATA_DIR"])
    last_run = text[: text.rindex("\nUSER ")].rsplit("\nRUN ", 1)[1]
    assert re.search(rf"chown -R gyre:gyre {data}\b", last_run)
    for name in WRITABLE:
        path = Path(env[name])
        assert path.is_relative_to(data), f"{name}={path} is outside GYRE_DATA_DIR"
        assert str(path) in last_run.split(), f"{name}={path} is not made before USER"
    assert "/app" not in last_run  # the code stays root's


def pods() -> list[tuple[str, dict[str, Any]]]:
    """(name, pod spec) of every Deployment and RayCluster group."""
    found = []
    for doc in k8s_docs():
        if doc["kind"] == "Deployment":
            found.append((doc["metadata"]["name"], doc["spec"]["template"]["spec"]))
        elif doc["kind"] == "RayCluster":
            found.append(("ray-head", doc["spec"]["headGroupSpec"]["template"]["spec"]))
            for group in doc["spec"]["workerGroupSpecs"]:
                found.append((f"ray-{group['groupName']}", group["template"]["spec"]))
    return found


def test_every_pod_runs_as_the_image_s_user_and_writes_under_the_data_folder():
    """runAsNonRoot as uid 1000; every mount but /dev/shm under GYRE_DATA_DIR; TMPDIR (Ray's
    session folders and sockets) node-local wherever Ray runs, and the vLLM servers' folder
    node-local on GPU pods (IPC sockets do not belong on a shared volume)."""
    config = next(d for d in k8s_docs() if d["kind"] == "ConfigMap")["data"]
    data, tmp = Path(config["GYRE_DATA_DIR"]), Path(image_env()["TMPDIR"])
    assert Path(image_env()["GYRE_DATA_DIR"]) == data
    names = {name for name, _ in pods()}
    assert {"gyre-web", "gyre-worker", "gyre-beat", "ray-head", "ray-gpu"} <= names
    for name, spec in pods():
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == 1000, name
        local = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        mounts = {m["mountPath"]: m["name"] for c in spec["containers"]
                  for m in c.get("volumeMounts", [])}  # fmt: skip
        for path in mounts:
            assert path == "/dev/shm" or Path(path).is_relative_to(data), (name, path)
        runs_ray = name.startswith("ray-") or "ray start" in json.dumps(spec["containers"])
        if runs_ray or name == "gyre-beat":
            assert mounts.get(str(tmp)) in local, f"{name}: no node-local {tmp}"
        gpus = any("nvidia.com/gpu" in c["resources"].get("limits", {}) for c in spec["containers"])
        if gpus:
            assert mounts.get(str(data / "vllm")) in local, f"{name}: vllm/ not node-local"
    beat = next(spec for name, spec in pods() if name == "gyre-beat")
    schedule = beat["containers"][0]["command"]
    assert Path(schedule[schedule.index("--schedule") + 1]).is_relative_to(tmp)


def test_compose_gives_each_container_its_own_tmpdir():
    """One shared data volume, but TMPDIR (Ray's session folder) per container: two Ray nodes
    in one temp folder would share a session folder."""
    services = compose()["services"]
    tmp = image_env()["TMPDIR"]
    for name in ("web", "worker", "beat", "ray-head", "ray-worker"):
        assert "gyre-data:/data" in services[name]["volumes"] and tmp in services[name]["volumes"]


def test_the_readme_states_the_units_requests_the_manifests_set():
    """What deploy/README.md says a GPU pod and a unit request is what the files set."""
    readme = (DEPLOY / "README.md").read_text()
    cluster = next(d for d in k8s_docs() if d["kind"] == "RayCluster")
    group = cluster["spec"]["workerGroupSpecs"][0]
    requests = group["template"]["spec"]["containers"][0]["resources"]["requests"]
    for key in ("cpu", "memory", "nvidia.com/gpu"):
        assert f"`{key}: {requests[key]}`" in readme, key
    assert f"`num-gpus: {group['rayStartParams']['num-gpus']}`" in readme
    assert "`num_gpus: 1`" in readme and re.search(r"placement\s+group", readme)  # a unit's
    assert "requests only `gpu_unit`, not `num_gpus`" not in readme
