"""A training checkpoint as a plain Hugging Face model directory (``gyre export``).

:func:`export_hf` reads the weights of a checkpoint, either format:

* sharded (``ShardedTrainer.save``, ``torch.distributed.checkpoint``): its ``.metadata``
  marks it. One process with no process group reads the ``"model"`` entries of the
  checkpoint (``get_state_dict``'s keys) into a model built on the CPU from the model
  folder's config; the optimizer state beside them is never read;
* plain (``save_checkpoint``): its ``model.safetensors``.

It writes what ``AutoModelForCausalLM`` and ``AutoTokenizer`` load: ``config.json`` (with the
chosen ``dtype``), the weights as safetensors in that dtype (``save_pretrained``: tied
weights stored once, big files split), ``generation_config.json`` and the tokenizer files
copied from the model folder. The directory is written beside ``out`` under a hidden name
and renamed into place, so ``out`` is never half written.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from gyre_core.train.checkpoint_dirs import checkpoints
from gyre_core.train.trainer import WEIGHTS_FILE

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DCP_METADATA = ".metadata"  # what torch.distributed.checkpoint writes last
# copied from the model folder when present (generation_config.json replaces the one
# save_pretrained derives from the config)
COPIED = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def checkpoint_format(path: Path) -> str | None:
    """``"sharded"``, ``"plain"``, or ``None`` when ``path`` holds neither's weights."""
    if (path / DCP_METADATA).is_file():
        return "sharded"
    if (path / WEIGHTS_FILE).is_file():
        return "plain"
    return None


def checkpoint_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint of either format, by parameter name, read whole in
    this process (for tools and benchmarks; no model folder needed)."""
    kind = checkpoint_format(checkpoint)
    if kind == "plain":
        return load_file(str(checkpoint / WEIGHTS_FILE))
    if kind == "sharded":
        from gyre_core.train.sharded_checkpoint import read_checkpoint

        weights: dict[str, torch.Tensor] = read_checkpoint(checkpoint)["model"]
        return weights
    raise ValueError(f"{checkpoint}: not a checkpoint (no {DCP_METADATA} or {WEIGHTS_FILE})")


def latest_exportable(root: Path) -> Path | None:
    """The complete checkpoint (``state.json`` present) of the highest version under
    ``root`` whose weights either format holds, or ``None``."""
    found = [p for _, p in checkpoints(root) if checkpoint_format(p)]
    return found[-1] if found else None


def export_hf(
    checkpoint: Path, model_dir: Path, out: Path, dtype: str = "bfloat16", *, force: bool = False
) -> Path:
    """Write ``checkpoint``'s weights, with ``model_dir``'s config and tokenizer, as a plain
    Hugging Face directory ``out`` in ``dtype``; return ``out``. A non-empty ``out`` is
    refused unless ``force`` (then replaced once the new one is written). Bad input raises
    ``ValueError`` naming the path."""
    checkpoint, model_dir, out = Path(checkpoint), Path(model_dir), Path(out)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    kind = checkpoint_format(checkpoint)
    if kind is None:
        what = f"no {DCP_METADATA} (sharded) or {WEIGHTS_FILE} (plain)"
        raise ValueError(f"{checkpoint}: not a checkpoint ({what})")
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir}: not a model folder (no config.json)")
    check_out(out, force, checkpoint, model_dir)
    model = _load(checkpoint, kind, model_dir)
    torch.nn.Module.to(model, dtype=DTYPES[dtype])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        for name in COPIED:
            if (model_dir / name).is_file():
                shutil.copyfile(model_dir / name, tmp / name)
        _plain_modes(tmp)
        check_out(out, force, checkpoint, model_dir)  # again: it may have changed meanwhile
        if out.exists():  # empty, or replaced under force: swap it out, then drop it
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def check_out(out: Path, force: bool, *sources: Path) -> None:
    """Refuse an ``out`` that is a file, a non-empty folder (unless ``force``), or one of
    ``sources`` or inside one (they would be replaced or written into)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(f"{out}: directory is not empty (pass --force to replace it)")
    real = out.resolve()
    for src in sources:
        if real == src.resolve() or src.resolve() in real.parents:
            raise ValueError(f"{out}: is or is inside {src}; export elsewhere")


def _plain_modes(folder: Path) -> None:
    """Every file the mode a plain write gets (``save_pretrained`` writes its weights
    0600, which a server running as another user could not read)."""
    mask = os.umask(0)
    os.umask(mask)
    for f in folder.iterdir():
        if f.is_file():
            f.chmod(0o666 & ~mask)


def _load(checkpoint: Path, kind: str, model_dir: Path) -> PreTrainedModel:
    """A float32 model of ``model_dir``'s config holding ``checkpoint``'s weights."""
    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten: keep the RNG
        model: PreTrainedModel = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch.float32
        )
    fits = f"its weights do not load into the model of {model_dir}"  # shape, key or file
    if kind == "plain":
        try:
            model.load_state_dict(load_file(str(checkpoint / WEIGHTS_FILE)))
        except Exception as e:  # a missing key, a shape, safetensors' own errors
            raise ValueError(f"{checkpoint}: {fits}: {_first_line(e)}") from None
        return model
    state = get_model_state_dict(model)  # the model's own tensors: loaded in place
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp_load({"model": state}, checkpoint_id=str(checkpoint))
    except CheckpointException as e:  # a BaseException: one failure per rank, here one
        cause = next(iter(e.failures.values()))[0] if e.failures else e
        raise ValueError(f"{checkpoint}: {fits}: {_first_line(cause)}") from None
    except Exception as e:  # any unreadable file (a truncated one, bad metadata) alike
        raise ValueError(f"{checkpoint}: {fits}: {_first_line(e)}") from None
    set_model_state_dict(model, state)
    return model


def _first_line(exc: BaseException) -> str:
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    return lines[0] if lines else type(exc).__name__


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
