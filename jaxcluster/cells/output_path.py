"""A client's output path proven before its first cell. ipyparallel's client subscribes to the
controller's iopub as it is made, and what the controller publishes before that subscription
has reached it is lost to the client (a ZMQ publisher drops what a subscriber it does not know
yet would get). A cell sent at once, as after an attach to a kept cluster, lost its whole
output so, and ended only after ``requests.OUTPUT_GRACE``. Here one process publishes a status
under a request of the client's (``engine/cells.announce``) until the client has it."""

from __future__ import annotations

import time
from typing import Any

from ..engine import cells
from .process_calls import ProcessCalls
from .requests import stand_in

ANNOUNCE_EVERY = 0.1  # seconds between a process's statuses, until the client has one
PROOF_SECONDS = 10.0  # for the first to come: a controller that never relays one is left be


def wait_until_output_flows(client: Any, calls: ProcessCalls, process: int) -> bool:
    """Whether ``client`` received an iopub message that ``process`` published (within
    ``PROOF_SECONDS``)."""
    header = client.session.msg_header("execute_request")
    _, came = client.create_message_futures(header["msg_id"], header, async_result=True)
    parent = stand_in(header, None, time.time_ns() // 1000)
    deadline = time.monotonic() + PROOF_SECONDS
    try:
        while time.monotonic() < deadline:
            _, errors = calls.call([process], cells.announce, parent, timeout=PROOF_SECONDS)
            if errors:  # the process is not there to say it: a cell will tell
                return False
            if came.wait(ANNOUNCE_EVERY):
                return True
        return False
    finally:
        client.purge_local_results(jobs=[header["msg_id"]])
