"""Run by test_embedded.py inside `manage.py shell` in embedded mode (no DATABASE_URL or
REDIS_URL): launches a sim run through the filesystem broker and prints what happened."""

import json
import sys
import time

from django.contrib.auth import get_user_model
from gyre_web.runs import services
from gyre_web.runs.models import Run, RunEvent
from gyre_web.teams.services import create_team

config = json.loads(sys.argv[-1])
user = get_user_model().objects.create_user(f"u{time.time_ns()}")
team = create_team(name=f"t{time.time_ns()}", owner=user)
exp = services.create_experiment(team=team, name="embedded")
run = services.create_run(experiment=exp, config=config)  # sent on commit (autocommit)
deadline = time.monotonic() + 90
while Run.objects.get(pk=run.pk).status not in ("succeeded", "failed", "cancelled"):
    if time.monotonic() > deadline:
        break
    time.sleep(0.2)
run.refresh_from_db()
seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
print(json.dumps({"status": run.status, "error": run.error, "seqs": seqs}))
