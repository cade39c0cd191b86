"""One ``%%spmd`` cell on every process: sent at once, its output relayed live, watched for
deaths, hangs and interrupts, and recovered from, least destructive step first. It offers
``spmd`` (``run``, ``SPMDResult``), ``live`` (outputs as they come), ``recovery`` (setup cells,
replayed), ``inboxes`` (engines on this host, reached directly) and ``stacks`` (a dump's main
thread)."""

__all__ = ["inboxes", "live", "recovery", "spmd", "stacks"]
