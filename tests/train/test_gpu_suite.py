"""benchmarks/gpu_suite.py, the device check a GPU machine with only PyTorch, transformers
and Triton runs: it imports nothing of Ray, vLLM, Django or Celery (a process where they
cannot be imported runs it), and its quick mode runs every section on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("ray", "vllm", "django", "celery")
# Installed in every Python process started with this folder on PYTHONPATH (the suite's
# spawned receiver too): importing a blocked package raises ImportError.
BLOCKER = f"""
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is not on the GPU machine (blocked)")
        return None

sys.meta_path.insert(0, Blocker())
"""
SECTIONS = [
    "env", "train.tiny.dense", "train.tiny.sparse", "precision.tiny", "handover.tiny",
    "tree_vs_linear.tiny", "streaming.tiny",
]  # fmt: skip


def _blocked_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    path = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def _python(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=_blocked_env(tmp_path),
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def test_the_suite_imports_without_ray_vllm_django_or_celery(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import benchmarks.gpu_suite, benchmarks.gpu_suite_sections, benchmarks.gpu_suite_handover\n"
        "import benchmarks.gpu_suite_streaming\n"
        f"print([m for m in {BLOCKED!r} if m in sys.modules])\n"
    )
    # Where they are installed (Ray and Django are here), none of them is imported ...
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-3000:]
    # ... and where they cannot be imported, the suite still imports (the quick run below
    # runs there too), while a module that does import Ray fails.
    blocked = _python(tmp_path, "-c", code)
    assert blocked.returncode == 0 and blocked.stdout.strip() == "[]", blocked.stderr[-3000:]
    ray_user = _python(tmp_path, "-c", "import gyre_core.runtime.ray_backend")
    assert ray_user.returncode != 0 and "ray is not on the GPU machine" in ray_user.stderr


def test_the_quick_suite_runs_every_section_on_the_cpu(tmp_path: Path) -> None:
    jsonl = tmp_path / "suite.jsonl"
    out = _python(tmp_path, "benchmarks/gpu_suite.py", "--quick", "--json-out", str(jsonl), timeout=300)  # fmt: skip
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert [ln["section"] for ln in lines] == SECTIONS, out.stdout + out.stderr[-3000:]
    failed = [ln for ln in lines if not ln["ok"]]
    assert not failed and out.returncode == 0, json.dumps(failed, indent=1)
    assert [json.loads(x) for x in jsonl.read_text().splitlines()] == lines
    env, *sections = lines
    assert env["torch"] == torch.__version__ and env["device"] == "cpu"
    assert all(ln["seconds"] > 0 for ln in sections)
    by = {ln["section"]: ln for ln in lines}
    train = by["train.tiny.dense"]
    assert train["tokens_per_s"] > 0 and train["mfu"] is None  # no peak for the CPU
    assert train["graphs_compiled_in_timed_steps"] == 0
    assert 0 < by["precision.tiny"]["rel_diff"] < 1e-2  # bf16 differs from fp32, a little
    assert by["handover.tiny"]["equal"] and by["handover.tiny"]["buckets"] > 1
    tvl = by["tree_vs_linear.tiny"]
    assert tvl["linear_tokens"] > tvl["tree_tokens"] > 0 and tvl["speedup"] > 0
    stream = by["streaming.tiny"]
    assert stream["rel_diff"] < 1e-5 and stream["exact"] and stream["placed"]
    assert stream["micro_steps"] > 1 and stream["pinned"] is None  # nothing pinned on the CPU
    assert "| tree_vs_linear.tiny | yes |" in out.stderr  # the markdown summary


def test_a_failing_section_is_reported_and_the_next_one_still_runs(tmp_path: Path) -> None:
    # An unknown shape fails its section with the error; the next section passes.
    out = _python(tmp_path, "benchmarks/gpu_suite.py", "--quick", "--shapes", "nope,tiny",
                  "--sections", "train.nope.dense,train.tiny.sparse")  # fmt: skip
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert [ln["section"] for ln in lines] == ["env", "train.nope.dense", "train.tiny.sparse"]
    env, bad, good = lines
    assert env["ok"] and good["ok"] and not bad["ok"] and out.returncode == 1
    assert bad["error"] == "KeyError: 'nope'" and "model_config" in "".join(bad["traceback"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_whole_suite_passes_on_the_gpu(tmp_path: Path) -> None:
    out = _python(tmp_path, "benchmarks/gpu_suite.py", timeout=600)
    failed = [ln for ln in map(json.loads, out.stdout.splitlines()) if not ln["ok"]]
    assert not failed and out.returncode == 0, json.dumps(failed, indent=1)


def test_the_mfu_counts_every_decoder_matmul_the_head_and_attention_not_the_embedding() -> None:
    from benchmarks.gpu_suite_common import model_config, step_flops
    from gyre_core.models.model import build_model
    from gyre_core.trajectory.sample import PackedSample

    conf = model_config("tiny2", 512)
    model = build_model(conf)
    layers = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2)
    params = sum(p.numel() for p in model.parameters())
    n = 10  # one chain of 10 tokens: token i attends to i + 1 keys, 55 pairs in all
    sample = PackedSample(
        group_ids=["g"], group=np.zeros(n, dtype=np.int32), input_ids=np.zeros(n, dtype=np.int64),
        position_ids=np.arange(n), parent=np.arange(-1, n - 1), trainable=np.ones(n, dtype=bool),
        advantage=np.ones(n), logprob=np.zeros(n), version=np.zeros(n, dtype=np.int64),
    )  # fmt: skip
    f = step_flops(conf, [sample], trained=4, params=params)
    assert f.matmul == 6 * layers * n  # decoder projections and MLPs, no norms, no embedding
    assert f.head == 6 * 512 * conf.hidden_size * 4  # only the rows projected
    assert f.attention == 3 * 4 * conf.num_attention_heads * conf.head_dim * 2 * 55
    assert f.six_n == 6 * params * n and f.model == f.matmul + f.head + f.attention
