"""Run inside ``manage.py shell`` by the e2e fixture: a demo user in a demo team with an
experiment, a viewer (watcher) in that team, an outsider in another team, a stored (not
launched) run with a trajectory tree for the tree browser, a stored run with a real
``gyre.trajectory/v1`` file imported (tokens, logprobs, versions; a small word tokenizer
kept beside its payload so the tokens decode), and two queued runs that no worker will take
(to cancel). Prints the ids as JSON."""

import io
import json

from django.contrib.auth import get_user_model
from gyre_web.runs import services
from gyre_web.teams.services import create_team, set_membership
from gyre_web.trajectories.imports import import_trajectories
from gyre_web.trajectories.payloads import TOKENIZER_FILE, payload_folder, run_decoder
from gyre_web.trajectories.services import create_tree
from tokenizers import Tokenizer, decoders
from tokenizers.models import WordLevel

from gyre_core.trajectory.synth import PRESETS, synth_rollouts
from gyre_core.trajectory.writer import write_rollouts

User = get_user_model()
demo = User.objects.create_user("demo", password="demo-pass")
outsider = User.objects.create_user("outsider", password="outsider-pass")
User.objects.create_user("newcomer", password="newcomer-pass")  # in no team until added
team = create_team(name="demo", owner=demo)
other = create_team(name="elsewhere", owner=outsider)
watcher = User.objects.create_user("watcher", password="watcher-pass")
set_membership(team=team, user=watcher, role="viewer")  # reads the demo team, writes nothing
exp = services.create_experiment(team=team, name="demo", created_by=demo)
services.create_experiment(team=other, name="theirs", created_by=outsider)

stored = services.create_run(
    experiment=exp, config={"backend": "sim", "name": "with-tree"}, name="with-tree",
    created_by=demo, launch=False,
)  # fmt: skip
nodes = [{"id": "root", "parent": None, "kind": "continue", "preview": "task: fix the failing test",
          "token_start": 0, "token_end": 120, "trainable": 0, "leaves": 120}]  # fmt: skip
start = 120
for b, kind in enumerate(["continue", "compaction", "subagent", "retry", "retry"]):
    nodes.append({"id": f"b{b}", "parent": "root", "kind": kind, "preview": f"branch {b} ({kind})",
                  "token_start": start, "token_end": start + 40, "trainable": 40,
                  "advantage": 0.1 * b, "leaves": 24})  # fmt: skip
    start += 40
    for c in range(24):
        text = "the needle is here" if (b, c) == (2, 17) else f"tool call {c} of branch {b}"
        nodes.append({"id": f"b{b}c{c}", "parent": f"b{b}", "kind": "continue", "preview": text,
                      "token_start": start, "token_end": start + 16, "trainable": 16,
                      "advantage": -0.5 + c / 24, "leaves": 1})  # fmt: skip
        start += 16
tree = create_tree(run_id=stored.pk, group_id="group-0", nodes=nodes)

# An imported trajectory file (the tiny synthetic preset: 2 groups of 3 rollouts, vocab 100),
# through the same service as POST /api/runs/{id}/import/.
imported = services.create_run(
    experiment=exp, config={"backend": "sim", "name": "with-tokens"}, name="with-tokens",
    created_by=demo, launch=False,
)  # fmt: skip
syllables = [c + v for c in "bdfgklmnprst" for v in "aeiou"]
words = {f"\u0120{syllables[i % 60]}{syllables[(i * 13 + i // 60) % 60]}": i for i in range(100)}
tokenizer = Tokenizer(WordLevel(vocab=words, unk_token=next(iter(words))))
tokenizer.decoder = decoders.ByteLevel()  # "\u0120" is a leading space, as in GPT-2 vocabularies
payload_folder(imported.pk).mkdir(parents=True, exist_ok=True)
tokenizer.save(str(payload_folder(imported.pk) / TOKENIZER_FILE))
jsonl = io.StringIO()
write_rollouts(jsonl, synth_rollouts(PRESETS["tiny"]))
counts = import_trajectories(
    run=imported, upload=io.BytesIO(jsonl.getvalue().encode()),
    decode=run_decoder(run_id=imported.pk),
)  # fmt: skip
assert counts["trees"] == 2, counts

waiting = [
    services.create_run(
        experiment=exp, config={"backend": "sim"}, name=f"waiting-{i}", created_by=demo,
        launch=False,
    ).pk
    for i in range(2)
]  # fmt: skip
print(json.dumps({"team": team.pk, "experiment": exp.pk, "tree_run": stored.pk,
                  "tree": tree.pk, "tokens_run": imported.pk, "waiting": waiting}))  # fmt: skip
