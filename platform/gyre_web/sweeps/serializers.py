from __future__ import annotations

from typing import Any

from rest_framework import serializers

from gyre_web.runs.models import Experiment
from gyre_web.runs.selectors import experiments_visible
from gyre_web.sweeps.expand import MAX_RUNS
from gyre_web.sweeps.models import Mode, Sweep
from gyre_web.sweeps.selectors import status_of


class SweepCreateSerializer(serializers.Serializer):
    experiment = serializers.PrimaryKeyRelatedField(queryset=Experiment.objects.none())
    name = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)
    base_config = serializers.DictField(help_text="a run config; each run varies it")
    mode = serializers.ChoiceField(choices=Mode.choices)
    params = serializers.DictField(
        help_text='field path -> values: grid {"train.lr": [1e-4, 3e-4]}; random also '
        '{"low": 1e-5, "high": 1e-3, "log": true} (and "int": true)'
    )
    samples = serializers.IntegerField(
        min_value=0, max_value=MAX_RUNS, default=0, help_text="random: how many runs"
    )
    seed = serializers.IntegerField(
        min_value=0, max_value=2**62, default=0, help_text="random: the draws' seed"
    )
    max_concurrent = serializers.IntegerField(
        min_value=1, max_value=MAX_RUNS, help_text="at most this many runs started at once"
    )

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        request = self.context.get("request")
        fields["experiment"].queryset = experiments_visible(getattr(request, "user", None))
        return fields


class SweepSerializer(serializers.ModelSerializer):
    status = serializers.SerializerMethodField()
    run_count = serializers.SerializerMethodField()

    class Meta:
        model = Sweep
        fields = [
            "id", "experiment", "name", "mode", "params", "samples", "seed", "max_concurrent",
            "base_config", "status", "run_count", "created_at", "cancelled_at",
        ]  # fmt: skip
        read_only_fields = fields

    def get_status(self, sweep: Sweep) -> str:
        """cancelled, running (a run is queued, starting or running) or finished"""
        return status_of(sweep)

    def get_run_count(self, sweep: Sweep) -> int:
        return int(getattr(sweep, "run_count", None) or sweep.sweep_runs.count())


class SweepRunSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    index = serializers.IntegerField(help_text="the run's place in the sweep, from 0")
    name = serializers.CharField()
    values = serializers.DictField(help_text="swept field path -> this run's value")
    status = serializers.CharField()
    launched = serializers.BooleanField(
        help_text="launched yet; a queued run that is not waits for a slot under the cap"
    )
    step = serializers.IntegerField()
    steps = serializers.IntegerField()
    benchmark_step = serializers.IntegerField(
        allow_null=True, help_text="the last step with benchmark scores"
    )
    benchmark = serializers.DictField(
        child=serializers.FloatField(), help_text="suite -> score at benchmark_step"
    )
    score = serializers.FloatField(allow_null=True, help_text="the mean of those scores")
    metrics = serializers.DictField(
        child=serializers.FloatField(), help_text="metric -> its value at its last step"
    )


class SweepDetailSerializer(SweepSerializer):
    runs = SweepRunSerializer(many=True, read_only=True)

    class Meta(SweepSerializer.Meta):
        fields = [*SweepSerializer.Meta.fields, "runs"]
        read_only_fields = fields
