"""One ``%%spmd`` cell on every process: sent at once (through each engine's inbox on this host,
else ipyparallel), its output relayed live, watched for deaths, hangs and interrupts, and
recovered from, least destructive step first. It offers ``spmd`` (``run`` and the
``SPMDResult`` it returns), ``live`` (each process's outputs as they come, and their blocks),
``recovery`` (setup cells, replayed after a restart), ``inboxes`` (the notebook's connections
to the engines on its host, which pushes use too) and ``stacks`` (a process's main-thread stack
in a dump); the cell's routes, the hang rule and global arrays' printouts are its own."""

__all__ = ["inboxes", "live", "recovery", "spmd", "stacks"]
