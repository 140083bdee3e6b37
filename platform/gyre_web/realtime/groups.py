"""Channel-layer group names, shared by the consumer and the code that wakes it (no
Channels import: the workers' sink wakes groups too)."""


def group_name(run_id: int) -> str:
    return f"run-{run_id}"
