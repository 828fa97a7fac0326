"""The control room: the Janus controller as one pure, clock-injected room (PAPER.md §2,
§4, §5, §8) that both shells drive.

`ControlRoom.plan_fast(snapshot, now)` and `plan_slow(snapshot, now)` take a
ControlSnapshot (control/snapshot.py: every model's instances and states, its telemetry
window, the devices, the oracle's predictors) and return typed Ops (control/ops.py);
the shell that called them carries the Ops out and reports back (`started`,
`finished`). The daemon's shell is server/controller.py (real workers, asyncio tasks);
the simulator's is sim/control_shell.py (timed moves on simulated devices). Neither
decides anything a plan decides: tests/test_control_rooms.py fails if one imports a
decision policy, and tests/test_control_conformance.py drives both shells with the same
traffic and compares their Op sequences.

Nothing here reads a clock, awaits or does I/O; control/observe.py is the one module
that reads the core (ServingCore), to build the snapshot both shells hand in."""
