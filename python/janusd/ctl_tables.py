"""`janus ctl`'s tables: the admin replies as rich tables that fit an 80-column terminal.

By default each table shows its essential columns (ESSENTIAL) under short headers, and
the page is the terminal's width (80 when output is not a terminal); `--wide` shows every
column under its JSON key on a page as wide as the terminal (200 when piped), as before.
`--json` never comes here (ctl_cli.py prints the reply as it is). Pure: replies in,
renderables out; `print_reply` is the one place that writes."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import Any

NARROW_WIDTH = 80  # the page when stdout is not a terminal
WIDE_WIDTH = 200  # the same with --wide

# table title -> its essential columns, in order (a title not listed shows every column)
ESSENTIAL: dict[str, tuple[str, ...]] = {
    "janusd": ("state", "pid", "uptime_s", "http", "models", "in_flight"),
    "dispatch": ("submitted", "completed", "rejected", "relaxed", "pending", "in_flight"),
    "models": ("name", "pool", "active", "rate_rps", "held", "ttft_p99_ms", "tpot_p99_ms", "attainment_1m"),
    "instances": ("model", "device", "node", "state", "role", "served", "error"),
    "pools": ("device", "node", "state", "models", "num_pages", "weight_pages", "kv_pages", "cached_pages", "free_pages"),
    "oracle": ("model", "source", "points", "last_fit_age_s", "busy", "error"),
    "steady devices": ("device", "phi", "items"),
    "steady moves (last plan)": ("kind", "model", "src", "dst", "reason"),
    "steady moves running / queued": ("kind", "model", "src", "dst", "for_s"),
    "steady moves done": ("kind", "model", "src", "dst", "seconds", "outcome", "reason"),
    "pools (classifier)": ("model", "pool", "reason"),
    "elastic models": ("model", "demand", "count", "reason"),
    "P/D roles": ("model", "device", "role", "state"),
    "keep-alive": ("model", "residency", "reason"),
    "in flight": ("model", "device", "target", "for_s", "reason"),
    "recent operations": ("model", "device", "target", "seconds", "outcome", "reason"),
}
# short headers of the narrow tables (a key not listed is its own header)
SHORT: dict[str, str] = {
    "uptime_s": "up s", "in_flight": "in flight", "rate_rps": "req/s", "ttft_p99_ms": "ttft99", "tpot_p99_ms": "tpot99",
    "attainment_1m": "attain", "num_pages": "pages", "weight_pages": "weights", "kv_pages": "kv",
    "cached_pages": "cached", "free_pages": "free", "last_fit_age_s": "fit age s", "for_s": "for s",
    "seconds": "s", "at": "time", "device": "dev",
}
# columns of free text: they wrap inside their cell
_TEXT = {"reason", "error", "note", "items", "models", "outcome", "what"}


def cell(key: str, value: Any) -> str:
    """One value as the tables show it."""
    if value is None:
        return ""
    if key == "at" and isinstance(value, (int, float)):
        return time.strftime("%H:%M:%S", time.localtime(value))
    if key == "attainment_1m" and isinstance(value, float):
        return f"{value * 100:.1f}%"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def table(title: str, rows: list[dict[str, Any]], wide: bool = False) -> Any:
    """A rich Table of `rows`: every column (`wide`) or the essential ones of `title`."""
    from rich import box
    from rich.table import Table

    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    keep = ESSENTIAL.get(title)
    if not wide and keep is not None:
        cols = [c for c in keep if c in cols] or cols
    t = Table(title=title, box=box.HEAVY_HEAD if wide else box.SIMPLE_HEAD, pad_edge=wide, title_justify="left")
    for c in cols:
        name = c if wide else SHORT.get(c, c)
        narrow_text = not wide and c in _TEXT
        # narrow: the reason takes the room the other columns leave; other free text folds
        t.add_column(name, overflow="fold", ratio=1 if narrow_text and c == "reason" else None,
                     no_wrap=not narrow_text and not wide, min_width=None if wide else len(name),
                     max_width=16 if narrow_text and c != "reason" else None)
    for r in rows:
        t.add_row(*(cell(c, r.get(c)) if not wide else ("" if r.get(c) is None else str(r.get(c))) for c in cols))
    return t


def what(e: dict[str, Any]) -> str:
    """What a decision does, short: "-> warm", "from 0 -> active" (a D2D fork), "-> decode
    (reassign)"; a migration's second half follows ("then 0 -> cold")."""
    out = f"from {e['source']} " if e.get("source") is not None else ""
    out += f"-> {e.get('role') or e['target']}" + (" (reassign)" if e["kind"] == "reassign" else "")
    then = e.get("then")
    return out + (f", then {then['device']} -> {then['target']}" if then else "")


def event_line(e: dict[str, Any]) -> str:
    """One decision as a line: time, number, model, device, what, outcome, reason (`ctl
    events --follow`)."""
    took = f" in {e['seconds']:.2f} s" if e.get("seconds") is not None else ""
    return (f"{cell('at', e['at'])} #{e['seq']} {e['model']} dev {e['device']} {what(e)}: {e['outcome']}{took} "
            f"- {e['reason']}")


def tables_of(action: str, data: dict[str, Any], wide: bool = False) -> Iterable[Any]:
    """The renderables `janus ctl ACTION` prints for its reply."""
    if action == "pools":
        keep = ("device", "host", "node", "state", "models", "running", "engine_requests", "num_pages", "free_pages",
                "weight_pages", "kv_pages", "cached_pages", "fragmentation_pct")
        yield table("pools", [{k: r[k] for k in keep if k in r} for r in data["pools"]], wide)
        return
    key = {"models": "models", "instances": "instances", "oracle": "oracle"}.get(action)
    if key:
        yield table(key, data[key], wide)
        return
    if action == "events":  # narrow: a line each (the reason is most of it), as --follow prints them
        if wide:
            yield table("events", data["events"], wide)
            return
        from rich.text import Text

        yield Text(f"events (the last {len(data['events'])} of {data.get('total', 0)} decisions; "
                   f"{data.get('kept')} kept)", style="bold")
        for e in data["events"]:
            yield Text(event_line(e), style="red" if e["outcome"] not in ("ok", "running") else "")
        return
    if action == "status":
        yield table("janusd", [{k: v for k, v in data.items() if k not in ("workers", "dispatch")}], wide)
        yield table("workers", data["workers"], wide)
        yield table("dispatch", [data["dispatch"]], wide)
        return
    if action == "plan":
        yield from _plan(data["plan"], wide)
        return
    if action in ("state", "fork"):  # one row for the move, one for its phases
        yield table(action, [{k: v for k, v in data.items() if k != "phases"}], wide)
        if data.get("phases"):
            yield table("phases (s)", [data["phases"]], wide)
        return
    yield table(action, [data], wide)


def _plan(p: dict[str, Any], wide: bool) -> Iterable[Any]:
    if not p.get("managed"):
        yield table("plan", [p], wide)
        return
    st = p.get("steady") or {}
    if st.get("bins_used") is not None:
        yield table("steady placement", [{k: st[k] for k in ("planned_at_s_ago", "bins_used", "phi", "migrations",
                                                              "failed_plans") if k in st}], wide)
        yield table("steady devices", st["devices"], wide)
        yield table("steady moves (last plan)", st["moves"], wide)
        yield table("steady moves running / queued", st["running"] + st["queued"], wide)
        yield table("steady moves done", st["recent"], wide)
        if st.get("notes"):
            yield table("steady notes", [{"note": n} for n in st["notes"]], wide)
    e = p["elastic"]
    yield table("elastic", [{k: v for k, v in e.items() if k != "apps"}], wide)
    yield table("pools (classifier)", p.get("pools", []), wide)
    yield table("elastic models", [{k: v for k, v in a.items() if k not in ("instances", "held")} for a in e["apps"]],
                wide)
    roles = [{"model": a["model"], **i} for a in e["apps"] for i in a.get("instances", ())]
    if roles:  # elastic P/D models: each instance's role now
        yield table("P/D roles", roles, wide)
        yield table("P/D removals held", [{"model": a["model"], **h} for a in e["apps"] for h in a.get("held", ())],
                    wide)
    yield table("keep-alive", p["keepalive"], wide)
    yield table("in flight", p["in_flight"], wide)
    yield table("recent operations", [{k: v for k, v in r.items() if k != "phases"} for r in p["recent"]], wide)


def page_width(wide: bool, isatty: bool | None = None) -> int | None:
    """The page: the terminal's width on a terminal (None: rich reads it), else 80 (200 wide)."""
    tty = sys.stdout.isatty() if isatty is None else isatty
    return None if tty else (WIDE_WIDTH if wide else NARROW_WIDTH)


def print_reply(action: str, data: dict[str, Any], wide: bool = False) -> None:
    if action == "config":
        sys.stdout.write(data["toml"])
        return
    from rich.console import Console

    console = Console(width=page_width(wide))
    for t in tables_of(action, data, wide):
        console.print(t)
