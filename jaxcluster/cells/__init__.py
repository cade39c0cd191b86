"""One ``%%spmd`` cell on every process: sent at once, its output relayed live, watched for
deaths, hangs and interrupts, and recovered from, least destructive step first. It offers
``spmd`` (``run``, ``SPMDResult``), ``live`` (outputs as they come), ``recovery`` (setup cells,
replayed), ``backchannel`` (calls to any process, also while it is busy) and ``inboxes`` (the
same calls to processes on this host, without the controller)."""

__all__ = ["backchannel", "inboxes", "live", "recovery", "spmd"]
