"""The JAX topology a scheduler put in this engine's environment, read without initializing JAX.

Kubeflow Trainer's JAX runtime (and many hand-written jobs) give every process the job's
``JAX_NUM_PROCESSES``, the process's own ``JAX_PROCESS_ID`` and the ``JAX_COORDINATOR_ADDRESS``
of process 0. ``process.identity`` reports them; the notebook checks that every engine's agree
(``cluster/topology.py``).

The variables are read here rather than through JAX's own detection
(``jax._src.clusters.ClusterEnv.auto_detect_unset_distributed_params``): that reads only
``JAX_COORDINATOR_ADDRESS`` of these (``jax.distributed.initialize`` takes the count and id as
arguments), and its detectors are not safe to call from an engine just to look: the Kubernetes
one asks the cluster's API server (and warns without the ``kubernetes`` package), the Cloud TPU
ones ask the metadata server with retries, and the first detector present wins, so engines that
inherited the notebook's Slurm or Open MPI variables would all report one rank. Those launch
ranks keep their own path (``process.launch_rank``).
"""

from __future__ import annotations

import os

PROCESS_ID = "JAX_PROCESS_ID"
NUM_PROCESSES = "JAX_NUM_PROCESSES"
COORDINATOR = "JAX_COORDINATOR_ADDRESS"
VARIABLES = (PROCESS_ID, NUM_PROCESSES, COORDINATOR)


def scheduler_topology() -> dict[str, str]:
    """Those of ``VARIABLES`` this process's environment sets (not empty), by name, as text:
    the notebook names a bad value in its error. ``{}``: no scheduler topology."""
    return {name: os.environ[name] for name in VARIABLES if os.environ.get(name, "").strip()}

