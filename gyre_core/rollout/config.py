"""The run's ``rollout`` section: the task suite, the batch per step, the benchmark, each
session's budgets (turns, context, tokens per call, sampling, time) and what the built-in
harness does in a session (sub-agents, retries: ``HarnessOptions.of``)."""

from __future__ import annotations

from dataclasses import dataclass

from gyre_core.config_fields import config_field


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    suite: str = config_field("repo", "task suite", choices=("repo", "coding"))
    size: str = config_field("short", "repo suite task size", choices=("short", "medium", "long"))
    tasks_per_step: int = config_field(2, "tasks sampled per training step", min=1)
    group_size: int = config_field(4, "rollouts per task (GRPO group)", min=1)
    benchmark_tasks: int = config_field(
        8, "held-out benchmark tasks scored before and after", min=1
    )
    benchmark_samples: int = config_field(
        0,
        "the benchmark's sessions a task, sampled at the rollout "
        "temperature: the policy's expected progress (0: one greedy "
        "session a task)",
        min=0,
        max=64,
    )
    benchmark_every: int = config_field(
        0,
        "also score the benchmark every k RL steps during the run, "
        "on that version's weights (0: only before and after)",
        min=0,
    )
    max_turns: int = config_field(24, "tool calls per rollout before it times out", min=1)
    context_budget: int = config_field(
        768, "tokens of context before the model compacts it", min=64
    )
    max_new_tokens: int = config_field(24, "tokens per LLM call", min=1)
    temperature: float = config_field(1.0, "sampling temperature", min=0.0)
    sample_seed: int = config_field(
        0,
        "another draw of the same run: offsets only the rollouts' "
        "sampling seeds (tasks, model, warm start and benchmark stay those "
        "of `seed`); 0 = the draws `seed` gives",
        min=0,
    )
    time_budget_s: float = config_field(
        600.0, "wall seconds per rollout before it times out", min=0.0
    )
    token_budget: int = config_field(
        4096, "generated tokens per rollout before it times out", min=1
    )
    tool_time_scale: float = config_field(
        0.0, "real seconds slept per simulated tool second", min=0.0
    )
    reward: str = config_field(
        "progress",
        "progress (share of components done), partial (finer credit: "
        "files, keys, checks), or binary (1 only when the task is done)",
        choices=("progress", "partial", "binary"),
    )
    hints: str = config_field(
        "off",
        "repo suite: 'status' ends every observation with the status line "
        "of the component in progress (docs/learning.md)",
        choices=("off", "status"),
    )
    env: str = config_field(
        "",
        "an environment plugin, 'package.module:Class' (docs/agents.md): "
        "replaces rollout.suite; '' = the built-in suite",
        max_length=300,
    )
    tasks: str = config_field(
        "",
        "the plugin environment's tasks: a JSONL or Parquet file, one task a "
        "line or row ('' = the plugin's own tasks(split))",
        max_length=500,
        path=True,
    )
    task_split_field: str = config_field(
        "split",
        "the task field naming its split (train, heldout, benchmark; train when absent)",
        max_length=100,
    )
    reward_fn: str = config_field(
        "",
        "'package.module:function' mapping a finished rollout and its "
        "environment to its reward ('' = rollout.reward on the progress)",
        max_length=300,
    )
    agent: str = config_field(
        "",
        "an external agent: 'package.module:function', called with each "
        "rollout's task and its own OpenAI-compatible base URL (docs/agents.md); "
        "'' = the built-in harness",
        max_length=300,
    )
    agent_command: str = config_field(
        "",
        "an external agent as a command line, run once a rollout in the task's "
        "folder with OPENAI_BASE_URL set to its session (docs/agents.md)",
        max_length=500,
    )
    benchmark_split: str = config_field(
        "benchmark",
        "what the benchmark scores: 'benchmark' = tasks in "
        "an unseen vocabulary, 'heldout' = unseen tasks in the train "
        "vocabulary",
        choices=("benchmark", "heldout"),
    )
    delegate: bool = config_field(
        False,
        "the built-in harness hands each component of a task to a sub-agent "
        "with its own context, whose result the main agent reads",
    )
    subagent_max_turns: int = config_field(
        0, "tool calls a sub-agent makes (0 = max_turns // components, at least 1)", min=0
    )
    eval_retries: int = config_field(
        2,
        "set by the run's owner: times a rollout's evaluation (the environment's progress and "
        "credit, the reward function) is tried again when it raises; when every try failed "
        "the rollout is dropped from training (failure 'evaluation'), never scored 0",
        min=0,
        max=10,
    )
    max_retries: int = config_field(
        2,
        "restores of a session to its last save point after a failure or a streak of "
        "error observations (the built-in harness)",
        min=0,
    )
