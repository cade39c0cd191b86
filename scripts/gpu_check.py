"""The GPU cases of issue 53, run on a GPU machine as a new user would; prints what each said.

    python scripts/gpu_check.py

Each case starts a cluster through the magics, in a headless IPython shell, and prints the
start's own lines (or its refusal) and one cell's output; the whole takes a few minutes. It
exits 1 where a case did not end as the rule says (``cluster/gpus.py``). On a machine without
a GPU it says so and exits 0. Cases, on a host with G GPUs:

1. ``--nodes 1``: one process, every GPU, a jitted sum.
2. ``--nodes 4 --devices-per-node 2`` without ``--platform``: CPU devices with one notice where
   the host has fewer than 8 GPUs, else 2 GPUs each.
3. the same with ``--platform cuda``: refused where G < 8.
4. ``--nodes 1 --devices-per-node 2 --platform cuda``: refused where G < 2.
5. ``--nodes 2 --platform cuda --allow-shared-gpu`` where G < 2: a psum across the processes
   fails in one line, without NCCL's or XLA's C++ log.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("IPP_NONINTERACTIVE", "1")

PSUM = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ("x",))
x = jax.device_put(jnp.ones(jax.device_count()), NamedSharding(mesh, P("x")))
print(float(jax.jit(jnp.sum)(x)))
"""


def run_case(shell, title: str, start: str, cell: str, refused: bool) -> bool:
    from IPython.utils.capture import capture_output

    print(f"\n=== {title}: %jax_cluster {start}", flush=True)
    with capture_output() as started:
        try:
            shell.run_line_magic("jax_cluster", start)
        except Exception as e:  # a refusal: the magic's UsageError, as a notebook shows it
            print(f"{type(e).__name__}: {e}")
    said = started.stdout
    print(said.strip())
    running = "global devices" in said
    ok = running != refused
    if running:
        with capture_output() as ran:
            try:
                shell.run_cell_magic("spmd", "", cell)
            except Exception as e:  # a failed cell: SPMDError, shown as its report
                render = getattr(e, "_render_traceback_", None)
                print("\n".join(render()) if render else f"{type(e).__name__}: {e}")
        shown = ran.stdout + ran.stderr + "".join(
            o.data.get("text/plain", "") for o in ran.outputs)
        print(shown.strip())
        chatter = [m for m in ("Source Location Trace", "external/xla", "NCCL WARN") if m in shown]
        if chatter:
            print(f"!!! C++ log in the cell: {chatter}")
            ok = False
        shell.run_line_magic("jax_cluster", "stop")
    print("--- as the rule says" if ok else "--- NOT as the rule says", flush=True)
    return ok


def main() -> int:
    from IPython.testing.globalipapp import start_ipython

    from jaxcluster.engine.accelerators import visible_gpus

    gpus = len(visible_gpus())
    print(f"This host shows {gpus} GPU(s): {visible_gpus()}")
    if not gpus:
        print("No GPU here: nothing to check.")
        return 0
    shell = start_ipython()
    shell.run_line_magic("load_ext", "jaxcluster")
    results = [
        run_case(shell, "1 process", "start --nodes 1", PSUM, refused=False),
        run_case(shell, "the quick start, no platform", "start --nodes 4 --devices-per-node 2",
                 PSUM, refused=False),
        run_case(shell, "the quick start on cuda",
                 "start --nodes 4 --devices-per-node 2 --platform cuda", PSUM, refused=gpus < 8),
        run_case(shell, "two GPUs for one process",
                 "start --nodes 1 --devices-per-node 2 --platform cuda", PSUM, refused=gpus < 2),
    ]
    if gpus < 2:
        results.append(run_case(shell, "a shared GPU",
                                "start --nodes 2 --platform cuda --allow-shared-gpu", PSUM,
                                refused=False))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
