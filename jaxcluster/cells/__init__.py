"""One ``%%spmd`` cell on every process: sent at once, its output relayed live, watched for
deaths, hangs and interrupts, and recovered from, least destructive step first. It offers
``spmd`` (``run``, ``SPMDResult``), ``calls`` (a function run as a cell), ``live`` (outputs as
they come), ``recovery`` (setup cells, replayed), ``backchannel`` (calls to any process, also
while it is busy), ``inboxes`` (the same calls to processes on this host, without the
controller), ``interrupts`` (the stop button, noted while a cell is sent and watched) and
``handle`` (what cells and data need of a cluster)."""

__all__ = ["backchannel", "calls", "handle", "inboxes", "interrupts", "live", "recovery", "spmd"]
