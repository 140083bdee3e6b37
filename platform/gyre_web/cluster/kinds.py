"""The kinds of the cluster event log (``ClusterEvent``), the websocket's ``cluster``
stream. Not run events: those are ``gyre_core.events``.

| kind | data |
| --- | --- |
| ``node_status`` | ``node`` (name), ``node_id`` (Ray's), ``alive``, ``gpus`` (GPU rows it has) |
| ``gpu_lease`` | ``run``, ``unit``, ``gpus`` (Gpu ids), ``held`` (true: leased, false: released) |
"""

from __future__ import annotations

NODE_STATUS = "node_status"  # sync_inventory made a node, or flipped its alive flag
GPU_LEASE = "gpu_lease"  # lease_gpus / release_gpus
KINDS = frozenset({NODE_STATUS, GPU_LEASE})

GROUP = "cluster"  # the channel-layer group woken after each commit, and the stream's name
