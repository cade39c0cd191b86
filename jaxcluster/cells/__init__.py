"""One ``%%spmd`` cell on its processes (all, or ``--targets``): sent at once, output relayed
live, watched for deaths, hangs and interrupts, recovered from, least destructive step first. It
offers ``spmd`` (``run``, ``SPMDResult``), ``calls`` (a function run as a cell), ``live``
(outputs as they come), ``recovery`` (setup cells, replayed), ``process_calls`` (calls to
processes by index: the link or ipyparallel), ``interrupts`` (the stop button, noted
while a cell runs), ``health_reports`` (what the health feed is told: ``ask_memory``),
``handle`` (what cells and data need of a cluster), ``carry`` (each process's state across a
restart), ``profile`` (one profile of every process, merged on one clock),
``profile_viewer`` (xprof, serving the profiles) and ``output_path`` (a new client's iopub
proven before its first cell)."""

__all__ = ["calls", "carry", "handle", "health_reports", "interrupts", "live", "output_path",
           "process_calls", "profile", "profile_viewer", "recovery", "spmd"]
