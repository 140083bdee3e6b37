"""A discrete-event simulator of a cluster running Gyre's scheduling policies on a
workload trace: ``workload`` (traces), ``costs`` (the cost table), ``engine`` (processor-
sharing engines), ``switch`` (the role-switch protocol), ``simulator`` (the event loop),
``bound`` (the makespan lower bound)."""
