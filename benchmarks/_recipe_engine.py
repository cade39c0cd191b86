"""Functions the benchmarks run on engines.

ipyparallel ships a function by value but first imports its module on the engine, so they
live here, in a module that imports nothing: the recipe's engines must not pay for
importing jaxcluster (or this package's other modules) during a timed start.
"""


def recipe_initialize(coordinator, num_processes, process_id, cpu_devices):
    """The hand-rolled recipe's per-engine step: pick CPU, then ``jax.distributed``."""
    import os

    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.config.update("jax_num_cpu_devices", cpu_devices)
    jax.distributed.initialize(coordinator, num_processes, process_id)
    return jax.device_count()


def device_count():
    import jax

    return jax.device_count()


def engine_pid():
    import os

    return os.getpid()
