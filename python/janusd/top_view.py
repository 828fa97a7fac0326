"""`janus top`'s screen: a pure function of the admin replies (no terminal, no socket).

A Frame holds one round of replies (status, models, instances, pools, events) or, when the
daemon cannot be reached, the error and the last round seen. `lines(frame, width,
height)` lays it out as exactly `height` lines or fewer of at most `width` cells:

- a header: the daemon's state, uptime, devices, models, requests in flight, the time;
  "DISCONNECTED" and why when the socket does not answer (the last round stays on screen);
- DEVICES: per device its page pool as a bar (weights, KV in use, KV cached, free) with
  pages used of all, and the instances on it with their states;
- MODELS: per model its pool (steady / elastic), request rate, TTFT and TPOT p50/p99 over
  the last minute (red past the model's SLO), per-token attainment over the last minute,
  instances by state and requests held for an Active instance; wider screens add the SLOs,
  the queue and the requests in flight;
- DECISIONS: the newest decisions first (time, model, device, what, outcome, reason).

Sections share the height: the header and titles always, then devices and models (a cut
list ends with "... N more"), decisions take what is left (at least 3 lines when the
screen has them). tests/test_top_view.py renders frames to fixed-size consoles."""

from __future__ import annotations

import io
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.text import Text

from janusd.ctl_tables import what

# the bar's characters and styles: weights, KV pages in use, KV pages cached, free
BAR = (("█", "bold blue", "weights"), ("▓", "magenta", "kv"), ("▒", "yellow", "cached"),
       ("·", "bright_black", "free"))
STATE_STYLE = {"active": "green", "warm": "yellow", "cold": "cyan", "loading": "magenta", "restoring": "magenta",
               "forking": "magenta", "draining": "red", "unloaded": "bright_black"}
STATE_CODE = {"active": "A", "warm": "W", "cold": "C", "loading": "L", "restoring": "R", "forking": "F",
              "draining": "D", "unloaded": "U"}
WIDE = 110  # from this width on the models panel shows SLOs, queue and requests in flight
MIN_DECISIONS = 3


@dataclass
class Frame:
    """One round of admin replies (each the reply's data), or the error that ended the
    round (`error`; the replies are then the last round seen, possibly empty)."""

    socket: str = ""
    status: dict[str, Any] = field(default_factory=dict)
    models: list[dict[str, Any]] = field(default_factory=list)
    instances: list[dict[str, Any]] = field(default_factory=list)
    pools: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    at: float = 0.0  # wall-clock time of the round
    error: str | None = None

    def data(self) -> dict[str, Any]:
        """The frame as one JSON-able object (`janus top --once --json`)."""
        return {"socket": self.socket, "at": self.at, "error": self.error, "status": self.status,
                "models": self.models, "instances": self.instances, "pools": self.pools, "events": self.events}


# ------------------------------------------------------------------ helpers
def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "--:--:--"


def _uptime(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1e3:.1f}s" if v >= 10_000 else f"{v:.0f}"


def _fit(t: Text, width: int) -> Text:
    t.no_wrap = True
    t.overflow = "ellipsis"
    t.truncate(width, overflow="ellipsis")
    return t


def _pad(t: Text | str, width: int, right: bool = False) -> Text:
    t = Text(t) if isinstance(t, str) else t.copy()
    if len(t) > width:
        t.truncate(width, overflow="ellipsis")
    pad = " " * (width - len(t))
    return Text(pad) + t if right else t + Text(pad)


def _title(name: str, note: str, width: int) -> Text:
    return _fit(Text(name, style="bold reverse") + Text(" " + note, style="bright_black"), width)


# ------------------------------------------------------------------ header
def header(f: Frame, width: int) -> Text:
    s = f.status
    t = Text("janusd ", style="bold")
    if f.error is not None:
        t.append("DISCONNECTED", style="bold white on red")
        t.append(f" {f.socket}: {f.error}; retrying", style="red")
        if s:
            t.append(f" | last seen {_clock(f.at)}", style="bright_black")
        return _fit(t, width)
    state = s.get("state", "?")
    t.append(state, style="green" if state == "running" else "yellow")
    workers = s.get("workers", [])
    up = sum(1 for w in workers if w.get("state") == "ready")
    t.append(f"  up {_uptime(s.get('uptime_s'))}  devices {up}/{len(workers)}  models {s.get('models', 0)}"
             f"  in flight {s.get('in_flight', 0)}  {_clock(f.at)}")
    if width >= 100:
        t.append(f"  http {s.get('http', '?')}", style="bright_black")
    t.append("  q quits", style="bright_black")
    return _fit(t, width)


# ------------------------------------------------------------------ devices
def _bar(p: dict[str, Any], width: int) -> Text:
    """The pool's pages as `width` cells: weights, KV in use, KV cached, then free (the
    rest, e.g. host copies or pages between owners, counts as used with weights)."""
    total = int(p.get("num_pages") or 0)
    t = Text()
    if total <= 0 or width <= 0:
        return _pad(Text("no pool figures", style="bright_black"), width)
    parts = [int(p.get("weight_pages") or 0), int(p.get("kv_pages") or 0), int(p.get("cached_pages") or 0)]
    free = int(p.get("free_pages") or 0)
    parts[0] += max(0, total - free - sum(parts))  # pages held by other owners
    parts.append(max(0, total - sum(parts)))
    cells = [round(n * width / total) for n in parts]
    for i, n in enumerate(parts):  # a non-empty part shows at least one cell
        if n > 0 and cells[i] == 0:
            cells[i] = 1
    while sum(cells) > width:  # take back from the largest
        cells[cells.index(max(cells))] -= 1
    cells[3] += width - sum(cells)
    for (ch, style, _), n in zip(BAR, cells):
        t.append(ch * n, style=style)
    return t


def device_lines(f: Frame, width: int, limit: int) -> list[Text]:
    by_dev: dict[int, list[dict[str, Any]]] = {}
    for i in f.instances:
        if i.get("state") != "unloaded" or i.get("error"):
            by_dev.setdefault(int(i["device"]), []).append(i)
    pools = sorted(f.pools, key=lambda p: p.get("device", 0))
    devices = sorted({int(p["device"]) for p in pools} | set(by_dev))
    pool_of = {int(p["device"]): p for p in pools}
    bar_w = max(10, min(60, (width - 20) // 3 if width < WIDE else width // 3))
    out: list[Text] = []
    for n, d in enumerate(devices):
        if len(out) == limit - 1 and len(devices) - n > 1:
            out.append(Text(f"... {len(devices) - n} more devices", style="bright_black"))
            break
        p = pool_of.get(d, {})
        t = Text(f"{d:>3} ", style="bold")
        t += _bar(p, bar_w)
        total, free = int(p.get("num_pages") or 0), int(p.get("free_pages") or 0)
        pct = f"{100 * (total - free) / total:3.0f}%" if total else "   -"
        t.append(f" {pct} {total - free:>4}/{total:<4}" if width >= WIDE else f" {pct} ")
        state = p.get("state")
        if state and state != "ready":
            t.append(f"[{state}] ", style="bold red")
        for k, i in enumerate(sorted(by_dev.get(d, []), key=lambda i: i["model"])):
            st = i.get("state", "?")
            word = st if width >= WIDE or len(by_dev[d]) <= 2 else STATE_CODE.get(st, st)
            t.append(("" if k == 0 else " ") + f"{i['model']} ")
            t.append(word + ("!" if i.get("error") else ""), style=STATE_STYLE.get(st, ""))
            if i.get("role") not in (None, "mixed") and width >= WIDE:
                t.append(f"({i['role']})", style="bright_black")
        out.append(_fit(t, width))
    return out or [Text("  no devices reported", style="bright_black")]


# ------------------------------------------------------------------ models
def _lat(p50: float | None, p99: float | None, slo: float | None) -> Text:
    t = Text()
    for k, v in enumerate((p50, p99)):
        if k:
            t.append("/")
        t.append(_ms(v), style="" if v is None or slo is None else ("red" if v > slo else "green"))
    return t


def _attain(a: float | None) -> Text:
    if a is None:
        return Text("-", style="bright_black")
    return Text(f"{a * 100:.1f}%", style="green" if a >= 0.95 else "yellow" if a >= 0.8 else "red")


def _states(insts: list[dict[str, Any]], words: bool) -> Text:
    c = Counter(i.get("state", "?") for i in insts)
    t = Text()
    for k, st in enumerate(s for s in STATE_CODE if c.get(s)):
        t.append(("" if k == 0 else " ") + (f"{c[st]} {st}" if words else f"{c[st]}{STATE_CODE[st]}"),
                 style=STATE_STYLE.get(st, ""))
    return t if len(t) else Text("-", style="bright_black")


def model_lines(f: Frame, width: int, limit: int) -> list[Text]:
    """The models panel: its header line, then one line per model (`limit` lines in all).
    From WIDE columns on, the SLOs, the queue and the requests in flight join while the
    model names still fit whole (the last of them is left out first)."""
    wide = width >= WIDE
    by_model: dict[str, list[dict[str, Any]]] = {}
    for i in f.instances:
        by_model.setdefault(i["model"], []).append(i)
    # (header, right-aligned, optional, the cell of a model)
    cols: list[tuple[str, bool, bool, Any]] = [
        ("model", False, False, lambda m: Text(m["name"], style="bold")),
        ("pool", False, False, lambda m: Text(str(m.get("pool", "-")))),
        ("req/s", True, False, lambda m: Text(f"{m.get('rate_rps', 0.0):.2f}")),
        ("ttft p50/99", True, False, lambda m: _lat(m.get("ttft_p50_ms"), m.get("ttft_p99_ms"), m.get("ttft_slo_ms"))),
        ("tpot p50/99", True, False, lambda m: _lat(m.get("tpot_p50_ms"), m.get("tpot_p99_ms"), m.get("tpot_slo_ms"))),
        ("ttft slo", True, True, lambda m: Text(_ms(m.get("ttft_slo_ms")))),
        ("tpot slo", True, True, lambda m: Text(_ms(m.get("tpot_slo_ms")))),
        ("attain", True, False, lambda m: _attain(m.get("attainment_1m"))),
        ("instances" if wide else "inst", False, False, lambda m: _states(by_model.get(m["name"], []), wide)),
        ("held", True, False, lambda m: Text(str(m.get("held", 0)), style="bold red" if m.get("held") else "")),
        ("queued", True, True, lambda m: Text(str(m.get("queued", 0)))),
        ("in flight", True, True, lambda m: Text(str(m.get("in_flight", 0)))),
    ]
    models = sorted(f.models, key=lambda m: m["name"])
    cols = [c for c in cols if wide or not c[2]]
    rows = [[c[3](m) for c in cols] for m in models]
    widths = [max([len(c[0])] + [len(r[k]) for r in rows]) for k, c in enumerate(cols)]

    def total() -> int:
        return sum(widths) + 2 * (len(cols) - 1)

    while total() > width and any(c[2] for c in cols):  # the optional columns go, the last first
        k = max(k for k, c in enumerate(cols) if c[2])
        del cols[k], widths[k]
        for r in rows:
            del r[k]
    if total() > width:  # then the model names give way
        widths[0] = max(8, widths[0] - (total() - width))

    def line(cells: list[Text]) -> Text:
        t = Text()
        for k, (cell, col) in enumerate(zip(cells, cols)):
            t += (Text("  ") if k else Text()) + _pad(cell, widths[k], col[1])
        return _fit(t, width)

    out = [line([Text(c[0], style="bold underline") for c in cols])]
    for n, r in enumerate(rows):
        if len(out) == limit - 1 and len(rows) - n > 1:
            out.append(Text(f"... {len(rows) - n} more models", style="bright_black"))
            break
        out.append(line(r))
    if not rows:
        out.append(Text("  no models", style="bright_black"))
    return out[:max(1, limit)]


# ------------------------------------------------------------------ decisions
def decision_line(e: dict[str, Any], width: int) -> Text:
    t = Text(_clock(e.get("at", 0.0)) + " ", style="bright_black")
    t.append(f"{e['model']} ", style="bold")
    t.append(f"dev {e['device']} ")
    t.append(what(e), style=STATE_STYLE.get(str(e["target"]), ""))
    outcome = e.get("outcome", "")
    took = f" {e['seconds']:.2f}s" if e.get("seconds") is not None else ""
    t.append(f" {outcome if outcome in ('ok', 'running') else 'failed'}{took} ",
             style="green" if outcome == "ok" else "yellow" if outcome == "running" else "bold red")
    t.append(str(e.get("reason", "")))
    if outcome not in ("ok", "running"):
        t.append(f" ({outcome})", style="red")
    return _fit(t, width)


def decision_lines(f: Frame, width: int, limit: int) -> list[Text]:
    events = sorted(f.events, key=lambda e: e.get("seq", 0), reverse=True)[:max(0, limit)]
    return [decision_line(e, width) for e in events] or [Text("  none yet", style="bright_black")]


# ------------------------------------------------------------------ screen
def lines(f: Frame, width: int, height: int | None = None) -> list[Text]:
    """The screen (module doc): at most `height` lines (None: as many as the frame has)."""
    width = max(40, width)
    legend = "  ".join(f"{ch} {name}" for ch, _, name in BAR)
    n_dev = max(1, len({int(p["device"]) for p in f.pools} | {int(i["device"]) for i in f.instances}))
    n_mod = 1 + max(1, len(f.models))
    if height is None:
        dev_lim, mod_lim, dec_lim = n_dev, n_mod, max(1, len(f.events))
    else:
        room = max(0, height - 4)  # header and the three titles
        dec_min = min(MIN_DECISIONS, max(1, len(f.events)))
        dev_lim = max(1, min(n_dev, room - dec_min - min(n_mod, 2)))
        mod_lim = max(2, min(n_mod, room - dev_lim - dec_min))
        dec_lim = max(0, room - dev_lim - mod_lim)
    out = [header(f, width),
           _title(" DEVICES ", f"pool pages: {legend}", width), *device_lines(f, width, dev_lim),
           _title(" MODELS ", "last minute; ms; A active W warm C cold; held: waiting for an Active instance"
                  if width < WIDE else "last minute; latencies in ms, red past the SLO; held: waiting for an "
                  "Active instance", width),
           *model_lines(f, width, mod_lim),
           _title(" DECISIONS ", "newest first, with their reasons", width)]
    if dec_lim > 0:
        out += decision_lines(f, width, dec_lim)
    return out if height is None else out[:height]


def render(f: Frame, width: int, height: int | None = None) -> Group:
    return Group(*lines(f, width, height))


def text(f: Frame, width: int, height: int | None = None) -> str:
    """The screen as plain text (tests, `janus top --once` when piped)."""
    from rich.console import Console

    c = Console(width=width, record=True, file=io.StringIO(), color_system=None, legacy_windows=False)
    c.print(render(f, width, height), crop=True)
    return c.export_text()
