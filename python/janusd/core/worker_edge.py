"""The Worker protocol: all the core needs of a device worker, and what it hears back.

A worker is reached by messages only (wire/worker_msgs.py Structs), so a worker in
another process (the daemon's WorkerHandle), on another host (later: placed by Ray) or
simulated (the simulator) plugs in behind the same two calls. What a worker says comes
back through ServingCore.on_batch / on_failed / on_kv / on_worker_death, each naming
the worker by its device index.
"""

from __future__ import annotations

from typing import Any, Protocol


class Worker(Protocol):
    device_index: int

    def send(self, msg: Any) -> bool:
        """Queue one wire message to the worker; False when it is not running."""
        ...
