"""Issue 41: a jitted step's dispatch under ``%%spmd`` against the same loop in plain JAX
processes that called ``jax.distributed.initialize`` by hand, 4 processes × 2 CPU devices.

Both run one loop, ``LOOP``: a jitted step on an 8×8 array sharded over the 4×2 mesh (a
multi-process program, no collective inside), called ``CALLS`` times, each call timed on every
process twice: until it returns (its dispatch) and until its result is ready (the step). A
process's figure is its fastest call, a round's figure the median over the processes: on
this 2-core machine four busy processes take turns, and a minimum is a call that ran alone.
The cluster and the plain processes both stay up for the whole run, and their rounds
alternate, with three more arms: the same engines with the dispatch record off, which tells
the record's own cost from the engine's; with a post hook that does nothing in its place, which
tells what JAX's call of any Python post hook costs from what ours does in it; and with the
record off and the stack JAX records at every call left whole (``engine/tracebacks.py``
bounds it to the cell's frames), which tells what that bound saves. A run's ratio is the
median of its rounds' ratios; runs go on until two in a row agree (within ``AGREE``), and the
last two are reported (target ≤ 1.05).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable

from jaxcluster import JaxCluster
from tests.ports import free_port

from ._common import Settings, Table, log, median, track

NODES, DEVICES = 4, 2
CALLS = 3000  # a round
TARGET = 1.05
AGREE = 0.03
MAX_RUNS = 5
RESULT = "_dispatch_per_call"
RECORD_OFF = "from jaxcluster.engine import dispatch as _record\n_record.uninstall()"
RECORD_ON = "from jaxcluster.engine import dispatch as _record\n_record.install()"
NOOP_HOOK = ("from jaxcluster.engine import jax_internals as _adapter\n"
             "_adapter.dispatch_hooks().set_post_hooks(lambda *a: None, lambda *a: None)")
NO_HOOK = "_adapter.dispatch_hooks().set_post_hooks(None, None)"
WHOLE_STACK = "from jaxcluster.engine import tracebacks as _bound\n_bound.uninstall()"
BOUND_STACK = "_bound.install(get_ipython())"
ARMS = ("record", "plain", "off", "noop", "stack")  # a round's arms, in the order they turn
# what each arm in the engines runs before its loop, and after it to put them back
SWITCHES = {"record": ("", ""), "off": (RECORD_OFF, RECORD_ON),
            "noop": (RECORD_OFF + "\n" + NOOP_HOOK, NO_HOOK + "\n" + RECORD_ON),
            "stack": (RECORD_OFF + "\n" + WHOLE_STACK, BOUND_STACK + "\n" + RECORD_ON)}
LOOP = f"""\
import time
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh(({NODES}, {DEVICES}), ("a", "b"))
x = jax.make_array_from_callback(
    (8, 8), NamedSharding(mesh, P("a", "b")), lambda i: jnp.ones((8, 8))[i])
step = jax.jit(lambda v: v * 0.5 + 1.0)
step(x).block_until_ready()
clock = time.perf_counter
dispatch = wait = 1.0
for _ in range({CALLS}):
    began = clock()
    y = step(x)
    dispatched = clock()
    y.block_until_ready()
    done = clock()
    dispatch, wait = min(dispatch, dispatched - began), min(wait, done - began)
{RESULT} = (dispatch, wait)
"""
# a plain process: initialize by hand, then run LOOP each time a line comes on stdin
PLAIN = """\
import json, sys
import jax
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", {devices})
jax.distributed.initialize({coordinator!r}, {nodes}, {index})
loop = {loop!r}
for line in sys.stdin:
    space = {{}}
    exec(loop, space)
    print(json.dumps(space[{result!r}]), flush=True)
"""


class Plain:
    """Four plain JAX processes, driven round by round over their stdin."""

    def __init__(self) -> None:
        coordinator = f"127.0.0.1:{free_port()}"
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-c", PLAIN.format(
                    devices=DEVICES, coordinator=coordinator, nodes=NODES, index=i, loop=LOOP,
                    result=RESULT)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, env=env)
            for i in range(NODES)
        ]

    def round(self) -> list[tuple[float, float]]:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        answers = []
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"a plain process ended (exit code {proc.wait()})")
            dispatch, step = json.loads(line)
            answers.append((float(dispatch), float(step)))
        return answers

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(Exception):
                proc.kill()
                proc.wait(10)


def _ours(cluster: JaxCluster, arm: str = "record") -> list[tuple[float, float]]:
    """The loop in the cluster's engines: with the dispatch record, without it ("off": JAX's
    own dispatch, as with ``JAXCLUSTER_DISPATCH_RECORD=0``), with a post hook that does
    nothing in its place ("noop"), or without it and with the stack JAX records at each call
    left whole ("stack": ipykernel's frames above the cell, as before ``engine/tracebacks``)."""
    before, after = SWITCHES[arm]
    if before:
        cluster.run(before).check()
    try:
        cluster.run(LOOP).check()
    finally:
        if after:
            cluster.run(after).check()
    return [(float(d), float(w)) for d, w in cluster.view.pull(RESULT, block=True)]


def _round(cluster: JaxCluster, plain: Plain, turn: int) -> list[tuple[float, ...]]:
    """One round, its arms (``ARMS``) in an order that turns round by round: for the dispatch
    and for the step, each arm's median over the processes of their fastest call."""
    arms: list[Callable[[], list[tuple[float, float]]]] = [
        plain.round if arm == "plain" else functools.partial(_ours, cluster, arm)
        for arm in ARMS]
    got: dict[int, list[tuple[float, float]]] = {}
    for k in range(len(ARMS)):
        arm = (turn + k) % len(ARMS)
        got[arm] = arms[arm]()
    return [tuple(median([p[i] for p in got[arm]]) for arm in range(len(ARMS))) for i in (0, 1)]


def run(settings: Settings) -> Table:
    table = Table("dispatch", f"a jitted step, {NODES} processes × {DEVICES} CPU devices: "
                  "%%spmd against plain processes")
    rounds = 2 if settings.quick else 40
    cluster = JaxCluster(nodes=NODES, devices_per_node=DEVICES, platform="cpu")
    plain = None
    runs: list[list[float]] = []  # per run: [dispatch ratio, step ratio]
    # dispatch, step: each of ``ARMS`` a round
    times: list[list[tuple[float, ...]]] = [[], []]
    try:
        cluster.start()
        track(cluster.cluster_id)
        plain = Plain()
        _round(cluster, plain, 0)  # compiled and warm on both sides
        while len(runs) < MAX_RUNS:
            rounds_here = [_round(cluster, plain, i) for i in range(rounds)]
            for i in (0, 1):
                times[i] += [r[i] for r in rounds_here]
            runs.append([median([r[i][0] / r[i][1] for r in rounds_here]) for i in (0, 1)])
            log(f"dispatch: run {len(runs)}: dispatch {runs[-1][0]:.3f}, step {runs[-1][1]:.3f}")
            if len(runs) >= 2 and all(_agree(runs[-2][i], runs[-1][i]) for i in (0, 1)):
                break
    finally:
        if plain is not None:
            plain.close()
        cluster.stop()
    last = runs[-2:]
    for i, what in enumerate(("dispatch (until the call returns)",
                              "step (until its result is ready)")):
        pair = [r[i] for r in last]
        agree = len(pair) == 2 and _agree(*pair)
        table.add(f"jitted step's {what}: fastest of {CALLS:,} calls per process, median over "
                  f"processes; last two runs of {rounds} alternating rounds",
                  f"{median([r[0] for r in times[i]]) * 1e6:.2f} µs",
                  f"{median([r[1] for r in times[i]]) * 1e6:.2f} µs",
                  " / ".join(f"{r:.3f}" for r in pair),
                  f"≤ {TARGET:g}, runs within {AGREE:.0%}", agree and max(pair) <= TARGET)

    def ratios(arm: str, to: str) -> list[float]:
        """Of the dispatch and of the step: the median over rounds of ``arm`` ÷ ``to``."""
        a, b = ARMS.index(arm), ARMS.index(to)
        return [median([r[a] / r[b] for r in times[i]]) for i in (0, 1)]

    off, bare, noop, whole = (ratios("record", "off"), ratios("off", "plain"),
                              ratios("noop", "off"), ratios("stack", "off"))
    table.notes.append(
        f"Where it goes, every round's {len(ARMS)} arms alternating: the same engines without "
        f"the dispatch record ran at {bare[0]:.3f} (dispatch) and {bare[1]:.3f} (step) of the "
        f"plain processes; the record costs {off[0]:.3f} and {off[1]:.3f} of them without it, "
        f"and a post hook that does nothing {noop[0]:.3f} and {noop[1]:.3f} (JAX's own call of "
        "a Python post hook, before anything in it runs). Without the record and with the "
        f"whole stack recorded at each call, they ran at {whole[0]:.3f} and {whole[1]:.3f} of "
        "themselves without the record (the stack bounded).")
    table.notes.append("Ratios of every run (dispatch, step): " + "; ".join(
        f"{d:.3f}, {w:.3f}" for d, w in runs) + ". Times: medians over every round.")
    table.notes.append("Baseline: 4 Python processes that call `jax.distributed.initialize` "
                       "by hand and run the same loop, started once, alternating with the "
                       "cluster's cells.")
    return table


def _agree(a: float, b: float) -> bool:
    return abs(a - b) <= AGREE * a
