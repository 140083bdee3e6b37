"""Gyre's vLLM worker extension (``--worker-extension-cls gyre_vllm_ext.GyreWorkerExtension``):
methods vLLM mixes into its worker, called through the server's ``POST /collective_rpc``.

An update is ``gyre_begin_update()``, one ``gyre_load_bucket(spec)`` per bucket (the
layout: ``gyre_weights``), then ``gyre_end_update()``: vLLM's layer-wise reload, the one its
``reload_weights`` runs, fed from buckets instead of files. Begin restores the layers'
checkpoint-format parameters (a CPU linear layer keeps its weights repacked for its kernel);
each bucket's tensors are read from a shared-memory file (mapped) and copied for the
model's own ``load_weights`` (fusing q/k/v and gate/up as for a checkpoint), and a
layer whose weights are all in is processed into its kernel format; end processes whatever
is left. ``spec`` is a JSON string ``{"path": file, "size": bytes, "entries":
[[name, dtype, shape, offset], ...]}``; a bucket returns the number of tensors it loaded.

This module runs in the vLLM server's worker, with that environment's packages: torch and
the standard library only (and ``gyre_weights`` beside it).
"""

from __future__ import annotations

import json

import torch
from gyre_weights import Entry, unpack


class GyreWorkerExtension:
    model_runner: object  # the vLLM worker's, which this class is mixed into

    def gyre_begin_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model_runner.model)  # type: ignore[attr-defined]

    def gyre_end_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = self.model_runner
        finalize_layerwise_reload(runner.model, runner.model_config)  # type: ignore[attr-defined]

    def gyre_load_bucket(self, spec: str) -> int:
        data = json.loads(spec)
        bucket = [Entry.from_wire(item) for item in data["entries"]]
        buf = torch.from_file(data["path"], shared=True, size=int(data["size"]), dtype=torch.uint8)
        model = self.model_runner.model  # type: ignore[attr-defined]
        # copies: vLLM's layer-wise reload may keep a loaded tensor until the update ends
        # (seen: views of a reused file came out corrupted), and the sender reuses this file
        # two buckets on
        model.load_weights(weights=((name, t.clone()) for name, t in unpack(buf, bucket)))
        return len(bucket)
