"""A device worker's shards of tensor-parallel instances ([P], DESIGN.md "Tensor
parallelism", "In the daemon").

A tp-N instance sits on an aligned device group; its lead device's worker serves it like
any model (the daemon sends it Tokenize, Generate, Abort) and every other worker of the
group holds one shard of it, in its own device's pool. The daemon asks the lead worker to
host the instance's rendezvous store (OpenGroup), then sends every worker of the group a
LoadModel with its rank (TPPlace). Each worker's loader thread joins the instance's
process group (engine/tp/comm.py), builds its shard (engine/tp/layout.py: it reads only
its slices) and learns whether every shard built (one gather): a shard that failed fails
the load on every worker, naming the shard. Then:
- the lead (rank 0) attaches the group to its ModelEngine (engine/tp/shard.py
  attach_leader: it announces each step and mirrors its KV pages), runs the prefill probe
  and registers the model as any worker does;
- a follower registers its shard (its worker's Stats show it; it never has work of its
  own) and its loader thread becomes the shard's follower thread: it runs the forward of
  every step the lead announces (engine/tp/shard.py Follower) until the lead unloads the
  model. Its worker's main thread stays free for the device's other messages.
A fork of a group is such a load whose LoadModel names the source shard of the same rank
(`fork`): the shard pulls its bytes over Mooncake instead of reading its slices, and a shard
whose pull fails reads its slices alone (engine/worker_fork.py pull_shard, server/tp_fork.py).
Unload: the lead tells its followers (OP_CALL "unload"); each follower's main thread frees
its shard and says so (one agreement), then the lead stops them (OP_STOP) and frees its
own. A follower whose collective fails (its lead died) frees its shard the same way. The
group lives and dies whole: the daemon kills the group's other workers when one dies and
loads the instance again once all of them are back (server/tp_groups.py).
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from janusd.engine.worker_log import log
from janusd.wire import worker_msgs as wm

# how long a follower's main thread may take to free its shard when the lead unloads it
RELEASE_WAIT_S = 30.0


class ReleaseShard(msgspec.Struct):
    """A follower thread asks its worker's main thread to free shard `name`; `done` (a
    threading.Event) is set once it is freed (None: nobody waits)."""

    name: str
    done: Any = None


class TPWorker:
    """WorkerProc's tensor-parallel part (a mixin). What it uses of WorkerProc, made in
    its constructor: the device engine, the inbox, _send."""

    de: Any
    device_index: int
    inbox: Any
    tp_stores: dict[str, Any]
    followers: dict[str, Any]  # shards this worker follows: their Follower (engine/tp/shard.py)
    pd: Any  # the worker's transfer engine (engine/worker_pd.py PDLink): a fork's pull

    if TYPE_CHECKING:
        def _send(self, msg: Any) -> None: ...

    # ---- the lead: the instance's rendezvous store ----
    def _open_group(self, msg: wm.OpenGroup) -> None:
        from janusd.engine.tp.comm import open_store

        try:
            store = open_store("127.0.0.1", 0, RELEASE_WAIT_S, is_master=True)
        except Exception as e:
            log(f"opening the tp store of {msg.name} failed:\n" + traceback.format_exc())
            self._send(wm.ErrorReply(msg.seq, f"cannot host the tp group's store of {msg.name!r}: {e}", "internal"))
            return
        self.tp_stores[msg.name] = store  # kept while the instance lives: its shards rendezvous through it
        self._send(wm.GroupOpened(msg.seq, int(store.port)))

    # ---- every shard: built on the loader thread ----
    def build_shard(self, msg: wm.LoadModel) -> Any:
        """Join the group, build this worker's shard, agree with the others that every
        shard built; the shard's ModelEngine (rank 0: the group attached, ready to step).
        Raises with every failed shard named; nothing stays allocated then."""
        from janusd.engine.loader import open_checkpoint
        from janusd.engine.tp.comm import TPComm, open_store
        from janusd.engine.tp.layout import ShardLayout
        from janusd.engine.tp.shard import LeaderLink, TPShard, attach_leader
        from janusd.engine.types import EngineError

        tp = msg.tp
        assert tp is not None
        comm = TPComm(open_store(tp.host, tp.port, tp.timeout_s), tp.rank, tp.size, self.de.device,
                      timeout_s=tp.timeout_s, host=tp.host)
        me, err = None, ""
        try:
            ck = open_checkpoint(msg.model.checkpoint, Path(msg.cache_dir) if msg.cache_dir else None)
            shard = TPShard(ShardLayout(ck.arch, tp.size, tp.rank), comm)
            me = self._shard_engine(msg, ck, shard)
        except Exception as e:  # every shard learns of it below: none serves half a model
            log(f"building shard {tp.rank} of {msg.model.name} failed:\n" + traceback.format_exc())
            err = str(e) or type(e).__name__
        said = [b.decode().split("|", 1) for b in comm.gather_bytes(f"{self.device_index}|{err}".encode())]
        bad = [(r, dev, e) for r, (dev, e) in enumerate(said) if e]
        if bad:
            if me is not None:
                self.de.drop_built(me)
            if len({e for _, _, e in bad}) == 1 and len(bad) == tp.size:
                raise EngineError(bad[0][2])  # the same on every shard (heads that do not divide): said once
            raise EngineError("; ".join(f"tp shard {r} (device {dev}): {e}" for r, dev, e in bad))
        assert me is not None  # no error anywhere: this shard built
        if tp.rank == 0:
            attach_leader(me, LeaderLink(comm, 0))
        me.tp_comm = comm
        return me

    def _shard_engine(self, msg: wm.LoadModel, ck: Any, shard: Any) -> Any:
        """This shard built: pulled from shard `rank` of a source group when the LoadModel
        names one (a fork), else (or when the pull fails: this shard alone falls back, as a
        single-device fork does) its slices read from the checkpoint. `me.arrival` says
        which: (path, fallback, bytes, seconds), for ModelLoaded."""
        from janusd.engine.worker_fork import pull_shard

        fallback = ""
        t0 = time.perf_counter()
        if msg.fork is not None:
            if self.pd.thread_nice:  # the pull yields to the worker's steps, as a fork's does
                from janusd.lifecycle.transfer import lower_priority

                lower_priority([threading.get_native_id()], self.pd.thread_nice)
            try:
                me = pull_shard(self.de, self.pd, msg, ck, shard)
                me.arrival = ("d2d", "", int(me.weight_bytes), time.perf_counter() - t0)
                return me
            except Exception as e:  # a dead or frozen source shard, a bad checksum: read our slices
                fallback = f"{type(e).__name__}: {e}"
                log(f"fork of tp shard {shard.layout.rank} of {msg.model.name} failed, reading its slices "
                    f"from the checkpoint: {fallback}")
                t0 = time.perf_counter()
        me = self.de.build_model(msg.model, msg.engine, None, checkpoint=ck, shard=shard)
        me.arrival = ("checkpoint", fallback, int(me.weight_bytes), time.perf_counter() - t0)
        return me

    # ---- a follower: its thread, its release ----
    def follow(self, name: str, me: Any) -> None:
        """The follower thread of shard `name` (the loader thread, after the build): run the
        lead's announced steps until it stops us; a broken group frees the shard."""
        from janusd.engine.tp.shard import Follower

        comm = me.tp_comm
        f = Follower(comm, lambda data: self._follower_call(name, comm, data))
        f.models[0] = me
        self.followers[name] = f
        try:
            f.serve()
        except Exception as e:
            log(f"tp shard of {name}: the group broke ({type(e).__name__}: {e}); freeing the shard")
            self.inbox.put(ReleaseShard(name))
        finally:
            if self.followers.get(name) is f:
                del self.followers[name]

    def tp_registered(self, me: Any) -> None:
        """Main thread, a model registered after a restore: a follower's shard restored from
        its host copy (Warm -> Active) is what its follower thread steps from now on."""
        comm = getattr(me, "tp_comm", None)
        f = self.followers.get(me.name)
        if comm is not None and comm.rank > 0 and f is not None:
            f.models[0] = me

    def _follower_call(self, name: str, comm: Any, data: bytes) -> None:
        cmd = json.loads(data)
        if cmd.get("op") != "unload":
            raise RuntimeError(f"tp follower of {name}: unknown call {cmd.get('op')!r} from the lead")
        done = threading.Event()
        self.inbox.put(ReleaseShard(name, done))
        comm.agree(done.wait(RELEASE_WAIT_S))

    def _release_shard(self, msg: ReleaseShard) -> None:
        """Main thread: free a follower's shard (the lead unloaded the model, or the group broke)."""
        if group_comm(self.de, msg.name) is not None:  # Active (de.models) or Warm (de.host)
            try:
                self.de.unload_model(msg.name)
            except Exception:
                log(f"freeing the tp shard of {msg.name} failed:\n" + traceback.format_exc())
        if msg.done is not None:
            msg.done.set()

    def exit_if_group_broke(self) -> None:
        """A step failed on a worker that leads a tp group: its shards no longer agree on
        the step (a follower died or hung, or a collective failed), so the instance cannot
        go on. The worker exits; the daemon fails its requests as a dead worker's (503,
        retryable) and restarts the group whole (server/tp_groups.py)."""
        if any(getattr(me, "group", None) is not None for me in self.de.models.values()):
            log("a tp group this worker leads broke during a step; exiting so that the group restarts whole")
            os._exit(3)

    def stop_followers(self, name: str) -> None:
        """Lead, before it frees its own shard (Active or Warm): every follower frees its
        shard, then stops. A broken group (a follower is gone) is logged and skipped: the
        daemon restarts it."""
        from janusd.engine.tp.shard import LeaderLink

        comm = group_comm(self.de, name)
        if comm is None or comm.rank != 0:
            return
        link = LeaderLink(comm, 0)
        try:
            link.call(json.dumps({"op": "unload"}).encode())
            if not comm.agree(True):
                log(f"tp {name}: a follower did not free its shard within {RELEASE_WAIT_S:g} s")
            link.stop()
        except Exception as e:
            log(f"tp {name}: stopping the followers failed ({type(e).__name__}: {e})")
        self.tp_stores.pop(name, None)


def group_comm(de: Any, name: str) -> Any:
    """The tp group (TPComm) of model `name` here, Active or Warm; None for a whole model."""
    me = de.models.get(name)
    if me is not None:
        return getattr(me, "tp_comm", None)
    host = de.host.get(name)
    return getattr(host.shard, "comm", None) if host is not None and host.shard is not None else None
