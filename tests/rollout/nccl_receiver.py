"""A stand-in for one vLLM server on the ``nccl`` weight-transfer backend, on a CPU: run by
the vllm venv's python (``python nccl_receiver.py STORE_PORT OUT_FILE``), it prints its
port and serves the routes an update uses until ``/shutdown``.

It does what vLLM 0.32's server does with each body, with vLLM's own classes where the
CPU allows: ``/init_weight_transfer_engine`` builds ``NCCLWeightTransferInitInfo(**init_info)``
(the unique id decoded and checked) and joins the group as rank ``rank_offset`` (over
gloo: NCCL needs a GPU, so the group's rendezvous is the store at ``STORE_PORT``);
``/update_weights`` builds ``NCCLWeightTransferUpdateInfo(**update_info)``, then receives
each tensor as ``NCCLWeightTransferEngine.receive_weights`` does unpacked (a new tensor of
that dtype and shape, one broadcast from rank 0). At ``/finish_weight_update`` the tensors
received are written to ``OUT_FILE`` (safetensors); a name received twice is an error.
"""

from __future__ import annotations

import json
import sys
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, TCPStore
from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo
from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

STORE_PORT, OUT = int(sys.argv[1]), Path(sys.argv[2])
TIMEOUT = timedelta(seconds=120)


class GlooReceiver:
    """A rank of ``gyre_core.rollout.nccl_sync.GlooGroup``'s group (same prefix, same
    warm-up), where vLLM's worker makes a PyNcclCommunicator."""

    def __init__(self, rank: int, world: int) -> None:
        store = TCPStore("127.0.0.1", STORE_PORT, world, False, TIMEOUT)
        self.pg = ProcessGroupGloo(PrefixStore("gyre-weights", store), rank, world, TIMEOUT)
        self.pg.allreduce([torch.zeros(1)]).wait()

    def broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor], opts).wait()


state: dict[str, object] = {"version": None, "group": None, "received": {}, "log": []}


def handle(path: str, body: dict) -> dict:
    state["log"].append(path)  # type: ignore[union-attr]
    if path == "/init_weight_transfer_engine":
        info = NCCLWeightTransferInitInfo(**body["init_info"])
        if info.nccl_unique_id_bytes is None or info.packed:
            raise ValueError(f"expected the unique-id mode, unpacked: {info}")
        state["group"] = GlooReceiver(info.rank_offset, info.world_size)
    elif path == "/start_weight_update":
        state["received"] = {}
    elif path == "/update_weights":
        info = NCCLWeightTransferUpdateInfo(**body["update_info"])
        group = state["group"]
        for name, dtype_name, shape in zip(info.names, info.dtype_names, info.shapes, strict=True):
            weight = torch.empty(shape, dtype=getattr(torch, dtype_name))
            group.broadcast(weight)  # type: ignore[union-attr]
            received = state["received"]
            if name in received:  # type: ignore[operator]
                raise ValueError(f"{name} received twice")
            received[name] = weight  # type: ignore[index]
    elif path == "/finish_weight_update":
        save_file(dict(state["received"]), str(OUT))  # type: ignore[call-overload]
    elif path == "/update_weight_version":
        state["version"] = body["new_version"]
    return {}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, code: int, data: object) -> None:
        raw = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.path == "/weight_info":
            self._reply(200, {"weight_version": state["version"]})
        else:
            self._reply(200, {"log": state["log"]})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        path = self.path.split("?")[0]
        if path == "/shutdown":
            self._reply(200, {})
            threading.Thread(target=server.shutdown).start()
            return
        try:
            self._reply(200, handle(path, body))
        except Exception as e:  # vLLM answers a refused body with an error status
            self._reply(400, {"error": f"{type(e).__name__}: {e}"})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
