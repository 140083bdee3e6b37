"""A run's config keeps its warm start in a ``warm_start`` section: the stored configs'
``train.warm_start_*`` fields move there (``warm_start_from`` is ``warm_start.weights``),
which the config now refuses under their old names."""

from typing import Any

from django.db import migrations

OLD = ("steps", "demos", "lr", "skip_check", "until_loss", "anneal_steps", "anneal_lr",
       "settle_loss", "rounds", "fresh_optimizer", "from", "data", "cache")  # fmt: skip
RENAMED = {"from": "weights"}


def moved(config: Any) -> Any:
    """``config`` with ``train.warm_start_*`` moved into ``warm_start`` (anything else as is)."""
    if not isinstance(config, dict) or not isinstance(config.get("train"), dict):
        return config
    train = dict(config["train"])
    section = dict(config["warm_start"]) if isinstance(config.get("warm_start"), dict) else {}
    for old in OLD:
        if f"warm_start_{old}" in train:
            section[RENAMED.get(old, old)] = train.pop(f"warm_start_{old}")
    if train == config["train"]:
        return config
    out = {**config, "train": train, "warm_start": section}
    return out


def back(config: Any) -> Any:
    if not isinstance(config, dict) or not isinstance(config.get("warm_start"), dict):
        return config
    new = {RENAMED.get(o, o): o for o in OLD}
    train = dict(config.get("train") or {})
    for name, value in config["warm_start"].items():
        train[f"warm_start_{new.get(name, name)}"] = value
    return {**{k: v for k, v in config.items() if k != "warm_start"}, "train": train}


def forward(apps: Any, schema_editor: Any, fn: Any = moved) -> None:
    Run = apps.get_model("runs", "Run")
    for run in Run.objects.only("pk", "config").iterator():
        config = fn(run.config)
        if config is not run.config:
            Run.objects.filter(pk=run.pk).update(config=config)


def backward(apps: Any, schema_editor: Any) -> None:
    forward(apps, schema_editor, back)


class Migration(migrations.Migration):
    dependencies = [("runs", "0008_checkpoint_exports")]

    operations = [migrations.RunPython(forward, backward)]
