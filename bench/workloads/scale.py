"""`scale`: what shard processes give one node (issue 27, docs/SHARDS.md). Run by name:
`raftlog bench scale`. One node (`raftlog serve --shards K`), a topic of 16 partitions RF 1
(placed over the K shards by the controller), keyed producer processes of 1 KiB records
(`--producers`, default 4), at leader acks and quorum acks (RF 1: flushed on the one replica),
with K = 1, 2, ... the usable cores. Figures: `scale.shardsK.leader.MBps`,
`scale.shardsK.quorum.MBps`, the ratios to one shard (`scale.ratio.shardsK.<acks>`, target
>= 0.8 x K), and CPU seconds per MB (utime+stime over the window: figures that hold up under
load) of the node (every shard process) and of the load generators, which share the cores
with the node: `producers_cpu_s_per_MB`, and from both the ceilings `MBps_cpu_ceiling` (every
core busy with the node and its producers) and `MBps_producers_out` (with the node alone).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

import trio

from bench.disk import DiskNeed
from bench.harness import serve_command
from bench.partitions_load import KeyedArgs, keyed_worker
from bench.partitions_probe import cpu_seconds, load_average
from bench.results import figure
from bench.workers import WorkerGroup
from bench.workloads.common import MB, Ctx
from raft.client import Client, UnavailableError

RECORD = 1024
TOPIC = "scale"
START_BOUND_S = 120.0
# Load generator processes. Four keep the node saturated (4 x window 8 x 256 KiB = 8 MB in
# flight: requests queue at the node, see each round's latency_ms_mean) and cost about 40%
# less CPU per MB than eight, CPU the shards share the cores with (docs/PERFORMANCE.md).
PRODUCERS = 4


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


def sizes(cfg: Any) -> dict[str, Any]:
    top = max(2, usable_cores())
    producers = getattr(cfg, "producers", None)
    if cfg.quick:
        return {"shards": (1, 2), "partitions": 4, "producers": producers or 2}
    return {"shards": tuple(range(1, top + 1)), "partitions": 16,
            "producers": producers or PRODUCERS}


def disk_need(cfg: Any) -> DiskNeed:
    """Throughput only, bounded by the measured seconds: nothing is read back."""
    return DiskNeed()


def steps(cfg: Any) -> int:
    return len(sizes(cfg)["shards"]) * 2 * cfg.repeats


def _ports(n: int) -> int:
    """The first of `n` consecutive free ports on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _cpu(pid: int) -> float:
    """utime+stime of the node: its process and its shard processes."""
    return sum(cpu_seconds(p) or 0.0 for p in (pid, *_children(pid)))


def _group_cpu(group: WorkerGroup) -> float:
    """utime+stime of the load generator processes (they share the machine's cores with the
    node: on a machine with few cores they are the bound, and this shows by how much)."""
    return sum(cpu_seconds(p.pid) or 0.0 for p in group.procs if p.pid is not None)


def _round(mb: float, cpu: float, gen: float, seconds: float, res: list[dict],
           shards: int) -> dict:
    """One measured window: MB/s, the node's and the producers' CPU seconds per MB, and two
    ceilings from them (they hold under load, as CPU per MB does): `MBps_cpu_ceiling`, the
    machine's cores busy with the node and its producers (cores / (node + producers CPU per
    MB)), and `MBps_producers_out`, the cores busy with the node alone (cores / node CPU per
    MB): what the node would do with the producers' CPU out of the way. Only for K >= cores:
    fewer shards cannot use every core (one shard is one core of Python)."""
    cores = usable_cores()
    per, gen_per = (cpu / mb, gen / mb) if mb and cpu else (None, None)
    return {"MBps": mb / seconds, "cpu_s_per_MB": per, "producers_cpu_s_per_MB": gen_per,
            "node_cores": cpu / seconds, "producers_cores": gen / seconds,
            "MBps_cpu_ceiling": cores / (per + gen_per) if per else None,
            "MBps_producers_out": cores / per if per and shards >= cores else None,
            "latency_ms_mean": _mean_latency_ms(res),
            "errors": [x["errors"] for x in res], "load": load_average()}


def _mean_latency_ms(res: list[dict]) -> float | None:
    """Mean produce latency over every producer: far above one request's service time when
    requests queue at the node, i.e. when the producers keep it saturated."""
    count = sum(x["latency"]["count"] for x in res)
    total = sum(x["latency"]["total"] for x in res)
    return total / count / 1000 if count else None


async def _create(address: str, partitions: int) -> dict[int, str]:
    deadline = time.monotonic() + START_BOUND_S
    while True:  # until the node listens (it is starting)
        try:
            return await _create_once(address, partitions)
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            await trio.sleep(0.2)


async def _create_once(address: str, partitions: int) -> dict[int, str]:
    async with Client([address], timeout=START_BOUND_S) as c:
        info = await c.create_topic(TOPIC, partitions, 1, timeout=START_BOUND_S)
        deadline = time.monotonic() + START_BOUND_S
        while any(p.leader_address is None for p in info.partitions):
            if time.monotonic() > deadline:
                raise RuntimeError("the topic's partitions got no leader in time")
            await trio.sleep(0.2)
            info = await c.topic(TOPIC, refresh=True)
        return {p.partition: p.leader_address for p in info.partitions}


def _node(ctx: Ctx, shards: int, data: str) -> tuple[subprocess.Popen, str]:
    port = _ports(shards)
    address = f"127.0.0.1:{port}"
    bound = ctx.disk.server_args if ctx.disk is not None else []
    cmd = [*serve_command(1), "--node-id", "1", "--data-dir", data, "--peers",
           f"1={address}", "--shards", str(shards), *bound, *ctx.cfg.server_args]
    log = open(os.path.join(data, "node.log"), "ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc, address


def _state(proc: subprocess.Popen, data: str) -> str:
    """Whether the node process ended (with its log's tail) or is still starting."""
    code = proc.poll()
    if code is None:
        return (f"is still running but did not answer within {START_BOUND_S:.0f} s (a loaded "
                f"machine: see `uptime`)")
    try:
        with open(os.path.join(data, "node.log"), "rb") as f:
            tail = f.read()[-1500:].decode(errors="replace")
    except OSError:
        tail = ""
    return f"exited with code {code}; its log ends:\n{tail}"


def _measure(ctx: Ctx, s: dict, shards: int, det: dict) -> dict[str, list[float]]:
    data = tempfile.mkdtemp(prefix=f"scale{shards}-", dir=ctx.data_dir or ctx.cfg.base_dir)
    proc, address = _node(ctx, shards, data)
    out: dict[str, list[float]] = {}
    try:
        try:
            leaders = trio.run(_create, address, s["partitions"])
        except Exception as e:  # say whether the node died or is slow (a loaded machine)
            raise RuntimeError(f"{e}; the node {_state(proc, data)}") from None
        warmup = 0.2 if ctx.cfg.quick else 1.0
        for acks in ("leader", "quorum"):
            keys = [[f"k{i}".encode() for i in range(p, s["partitions"] * 8, s["producers"])]
                    for p in range(s["producers"])]
            args = [KeyedArgs(TOPIC, leaders, k, RECORD, ctx.cfg.batch_bytes // RECORD,
                              ctx.cfg.window, warmup, ctx.cfg.duration, acks=acks,
                              partitions=s["partitions"]) for k in keys]
            rounds = []
            with WorkerGroup(keyed_worker, args) as group:
                for _ in range(ctx.cfg.repeats):
                    t0 = group.release()
                    time.sleep(max(0.0, t0 + warmup - time.monotonic()))
                    c0, g0 = _cpu(proc.pid), _group_cpu(group)
                    res = group.collect(timeout=warmup + ctx.cfg.duration + 60)
                    cpu, gen = _cpu(proc.pid) - c0, _group_cpu(group) - g0
                    mb = sum(x["ok_records"] for x in res) * RECORD / MB
                    rounds.append(_round(mb, cpu, gen, ctx.cfg.duration, res, shards))
                    ctx.advance("scale")
            det[f"shards{shards}.{acks}"] = rounds
            out[acks] = [r["MBps"] for r in rounds]
            for key in ("cpu_s_per_MB", "producers_cpu_s_per_MB", "MBps_cpu_ceiling",
                        "MBps_producers_out"):
                out[f"{acks}.{key}"] = [r[key] for r in rounds]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not ctx.cfg.keep:
            shutil.rmtree(data, ignore_errors=True)
    return out


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    s = sizes(ctx.cfg)
    det: dict[str, Any] = {"sizes": dict(s), "cores": usable_cores(),
                           "load_start": load_average()}
    figs: list[dict] = []
    base: dict[str, list[float]] = {}
    for k in s["shards"]:
        ctx.describe(f"scale: one node, {k} shard(s), {s['partitions']} partitions RF 1")
        try:
            got = _measure(ctx, s, k, det)
        except Exception as e:  # noqa: BLE001 - one point lost, not the run
            det[f"shards{k}"] = {"error": ctx.point_failed("scale", f"shards{k}", e)}
            continue
        for acks in ("leader", "quorum"):
            params = {"shards": k, "partitions": s["partitions"], "producers": s["producers"]}
            figs.append(figure(f"scale.shards{k}.{acks}.MBps", "scale",
                               f"{acks} acks 1KiB x{s['producers']}, {k} shard(s)", "MB/s",
                               got[acks], params=params))
            figs.append(figure(f"scale.shards{k}.{acks}.cpu_s_per_MB", "scale",
                               f"node CPU seconds per MB, {acks} acks, {k} shard(s)", "s/MB",
                               got[f"{acks}.cpu_s_per_MB"], better="lower", params=params))
            figs.append(figure(f"scale.shards{k}.{acks}.producers_cpu_s_per_MB", "scale",
                               f"load generators' CPU seconds per MB, {acks} acks, {k} "
                               f"shard(s)", "s/MB", got[f"{acks}.producers_cpu_s_per_MB"],
                               better="lower", params=params))
            figs.append(figure(f"scale.shards{k}.{acks}.MBps_cpu_ceiling", "scale",
                               f"{acks} MB/s, {k} shard(s), every core busy (cores / node+"
                               f"producers CPU per MB)", "MB/s",
                               got[f"{acks}.MBps_cpu_ceiling"], params=params))
            if k >= usable_cores():
                figs.append(figure(f"scale.shards{k}.{acks}.MBps_producers_out", "scale",
                                   f"{acks} MB/s, {k} shard(s), producers' CPU out of the "
                                   f"way (cores / node CPU per MB)", "MB/s",
                                   got[f"{acks}.MBps_producers_out"], params=params))
            if k == 1:
                base[acks] = got[acks]
            elif acks in base:
                figs.append(figure(f"scale.ratio.shards{k}.{acks}", "scale",
                                   f"{acks} MB/s {k} shards / 1 shard", "x",
                                   [a / b if b else None for a, b in zip(got[acks],
                                                                         base[acks])],
                                   params={"shards": k}, target=(">=", 0.8 * k)))
    det["load_end"] = load_average()
    return figs, det
