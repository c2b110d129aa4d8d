"""results.json: its schema, validation, the summary table and `--compare`.

One flat list of figures, each self-describing (unit, direction, bounding limit, target), so a
compare, a table or a doc generator needs no knowledge of the workloads that made them.
"""

from __future__ import annotations

import json
import math
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.stats import Summary

SCHEMA_VERSION = 1

FIGURE_FIELDS = ("id", "workload", "title", "unit", "better", "params", "median", "min", "max",
                 "samples", "limit", "limit_value", "fraction_of_limit", "target", "met")
# `errors`: [{"workload", "error", "point"?}] for each workload or point that failed (a dead
# load generator, a cluster that did not come up); the run goes on without it.
TOP_FIELDS = ("schema", "tool", "date", "command", "machine", "config", "limits", "figures",
              "details", "errors", "plots", "elapsed_s")
LIMIT_FIELDS = ("fsync_ms", "lmdb_commit_ms", "rpc_floor_ms", "seq_write_MBps",
                "tcp_loopback_MBps", "lmdb_append_MBps")


def figure(id: str, workload: str, title: str, unit: str, samples: list[float | None], *,
           better: str = "higher", params: dict | None = None, limit: str | None = None,
           limit_value: float | None = None, target: tuple[str, float] | None = None) -> dict:
    """A figure: median/min/max over repeats, with its machine bound and target.

    fraction_of_limit is how close the figure is to its bound (1.0 = at the machine limit):
    median / limit for higher-is-better figures, limit / median for latencies."""
    s = Summary.of(samples)
    frac = None
    if s.median is not None and limit_value:
        frac = s.median / limit_value if better == "higher" else (
            limit_value / s.median if s.median > 0 else None)
    met = None
    if target is not None and s.median is not None:
        op, val = target
        met = s.median >= val if op == ">=" else s.median <= val
    return {"id": id, "workload": workload, "title": title, "unit": unit, "better": better,
            "params": params or {}, "median": s.median, "min": s.min, "max": s.max,
            "samples": s.samples, "limit": limit, "limit_value": limit_value,
            "fraction_of_limit": frac,
            "target": {"op": target[0], "value": target[1]} if target else None, "met": met}


def missing_fields(results: dict[str, Any]) -> list[str]:
    """Every field a consumer of results.json may rely on that is absent (empty = complete)."""
    out = [f for f in TOP_FIELDS if f not in results]
    out += [f"limits.{f}" for f in LIMIT_FIELDS if f not in results.get("limits", {})]
    for fig in results.get("figures", []):
        out += [f"figures[{fig.get('id')}].{f}" for f in FIGURE_FIELDS if f not in fig]
    return out


def save(results: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=False, default=_json_default)
        f.write("\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and math.isnan(o):
        return None
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def load(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "—"
    if abs(v) >= 1e6:
        s = f"{v / 1e6:,.2f}M"
    elif abs(v) >= 1000:
        s = f"{v:,.0f}"
    elif abs(v) >= 10:
        s = f"{v:.1f}"
    else:
        s = f"{v:.3g}"
    return f"{s} {unit}".strip()


_LIMIT_SHORT = {"tcp_loopback_MBps": "tcp", "lmdb_append_MBps": "lmdb", "quorum_floor_ms": "floor",
                "seq_write_MBps": "disk"}


def summary_table(results: dict[str, Any], title: str = "raftlog bench") -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("figure")
    t.add_column("median", justify="right")
    t.add_column("min … max", justify="right")
    t.add_column("of limit", justify="right")
    t.add_column("target", justify="right")
    for fig in results["figures"]:
        frac = fig.get("fraction_of_limit")
        tgt = fig.get("target")
        met = fig.get("met")
        tgt_s = "" if tgt is None else (
            f"{tgt['op']} {fmt(tgt['value'])} "
            + ("[green]met[/]" if met else "[red]missed[/]" if met is False else "—"))
        t.add_row(fig["title"], fmt(fig["median"], fig["unit"]),
                  f"{fmt(fig['min'])} … {fmt(fig['max'])}",
                  "" if frac is None else f"{frac:.0%} of {_LIMIT_SHORT.get(fig.get('limit'), '')}",
                  tgt_s)
    return t


def compare_table(new: dict[str, Any], old: dict[str, Any]) -> Table:
    """Each figure beside the old one; ratio new/old, green when it moved the good way."""
    olds = {f["id"]: f for f in old.get("figures", [])}
    t = Table(title=f"compare with {old.get('date', '?')}", title_justify="left")
    for col, j in (("figure", "left"), ("old", "right"), ("new", "right"), ("ratio", "right")):
        t.add_column(col, justify=j)
    for fig in new["figures"]:
        o = olds.get(fig["id"])
        om = o.get("median") if o else None
        nm = fig.get("median")
        ratio = nm / om if (om and nm is not None) else None
        if ratio is None:
            r = "—"
        else:
            good = ratio >= 1 if fig.get("better", "higher") == "higher" else ratio <= 1
            color = "green" if good else "red"
            r = f"[{color}]{ratio:.2f}×[/]"
        t.add_row(fig["title"], fmt(om, fig["unit"]), fmt(nm, fig["unit"]), r)
    for fid, o in olds.items():
        if fid not in {f["id"] for f in new["figures"]}:
            t.add_row(o.get("title", fid), fmt(o.get("median"), o.get("unit", "")), "—", "—")
    return t


def print_summary(results: dict[str, Any], console: Console,
                  compare: dict[str, Any] | None = None) -> None:
    console.print(summary_table(results))
    if compare is not None:
        console.print(compare_table(results, compare))
