"""The run config's ``train.warm_start_*`` fields are a ``warm_start`` section now (runs
0009): a sweep's base config moves them there, and its swept field paths and each sweep
run's values name them by their new paths (``train.warm_start_from``: ``warm_start.weights``)."""

from typing import Any

from django.db import migrations

OLD = ("steps", "demos", "lr", "skip_check", "until_loss", "anneal_steps", "anneal_lr",
       "settle_loss", "rounds", "fresh_optimizer", "from", "data", "cache")  # fmt: skip
PATHS = {f"train.warm_start_{o}": f"warm_start.{'weights' if o == 'from' else o}" for o in OLD}


def _config(config: Any, paths: dict[str, str]) -> Any:
    if not isinstance(config, dict):
        return config
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    for old, new in paths.items():
        (osec, oname), (nsec, nname) = old.split("."), new.split(".")
        if isinstance(out.get(osec), dict) and oname in out[osec]:
            target = out[nsec] if isinstance(out.get(nsec), dict) else {}
            target[nname] = out[osec].pop(oname)
            out[nsec] = target
    return out


def _keys(mapping: Any, paths: dict[str, str]) -> Any:
    if not isinstance(mapping, dict):
        return mapping
    return {paths.get(k, k): v for k, v in mapping.items()}


def forward(apps: Any, schema_editor: Any, paths: dict[str, str] = PATHS) -> None:
    Sweep = apps.get_model("sweeps", "Sweep")
    SweepRun = apps.get_model("sweeps", "SweepRun")
    for sweep in Sweep.objects.all().iterator():
        base, params = _config(sweep.base_config, paths), _keys(sweep.params, paths)
        if (base, params) != (sweep.base_config, sweep.params):
            Sweep.objects.filter(pk=sweep.pk).update(base_config=base, params=params)
    for sr in SweepRun.objects.all().iterator():
        values = _keys(sr.values, paths)
        if values != sr.values:
            SweepRun.objects.filter(pk=sr.pk).update(values=values)


def backward(apps: Any, schema_editor: Any) -> None:
    forward(apps, schema_editor, {new: old for old, new in PATHS.items()})


class Migration(migrations.Migration):
    dependencies = [("sweeps", "0001_initial")]

    operations = [migrations.RunPython(forward, backward)]
