"""The engine's session: every hook jaxcluster puts into an engine's process (into JAX, IPython,
ipykernel and the standard library), installed once, in the order ``PARTS`` declares, and one
per-cell hook, which tells the parts of each cell's start and end in that same order.

A part whose internals this JAX or IPython lacks stays out (``jax_internals.missing``,
``ipython_internals.missing`` say why); the others go in. ``docs/architecture.md`` lists what
each part patches and which thread runs what.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..link import addresses
from . import (
    cells,
    chatter,
    data,
    dispatch,
    ipykernel_internals,
    jax_internals,
    link_end,
    reads,
    scripts,
    sharding,
    shards,
    stdin,
    tracebacks,
    values,
)


@dataclass(frozen=True)
class Part:
    """One concern's hooks: ``install`` puts them in; ``new_cell`` and ``cell_ended`` run as
    every cell starts (IPython's ``pre_run_cell``) and ends (``post_run_cell``)."""

    name: str
    install: Callable[[EngineSession], object]
    new_cell: Callable[[EngineSession], None] | None = None
    cell_ended: Callable[[EngineSession], None] | None = None


class EngineSession:
    """This engine's hooks, installed once (``start``). ``address``: where the other hosts
    reach this process's link; ``gpus``: the GPUs it was given, if not all it sees;
    ``machine``: what tells its machine from another (``process.machine``)."""

    def __init__(self, address: str | None, gpus: list[int] | None, machine: str | None
                 ) -> None:
        self.address, self.gpus, self.machine = address, gpus, machine
        self.link: dict[str, str] | None = None  # where its link listens, once open
        self.shell = _shell()

    def install(self) -> None:
        for part in PARTS:
            part.install(self)

    def hook_cells(self) -> None:
        """One callback per event of IPython's, calling the parts in ``PARTS``' order."""
        if self.shell is not None:
            self.shell.events.register("pre_run_cell", self.new_cell)
            self.shell.events.register("post_run_cell", self.cell_ended)

    def new_cell(self, *_: Any) -> None:
        for step in STARTING_A_CELL:
            step(self)

    def cell_ended(self, *_: Any) -> None:
        for step in ENDING_A_CELL:
            step(self)

    def open_link(self) -> None:
        """This engine's link (``link_end``), on ``address``, or where the coordinator is
        reached from; where it opened already (at bring-up), as it is. With jax.distributed
        up, this process's shards are served on it to the others' reads (``shards.py``)."""
        state = jax_internals.coordination()
        towards = state.coordinator_address if state is not None else None
        address = self.address or addresses.address_towards(towards or "127.0.0.1:0")
        self.link = link_end.open_link(address)
        kernel = ipykernel_internals.kernel()
        if (self.link is None or kernel is None or state is None or state.client is None
                or state.process_id is None):
            return
        shards.serve(self.link["tcp"], bytes(kernel.session.key),
                     kernel.session.signature_scheme, kernel.engine_id, state.process_id,
                     state.client, self.machine)


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _with_shell(install: Callable[[Any], object]) -> Callable[[EngineSession], object]:
    return lambda session: session.shell is not None and install(session.shell)


# The order, and why. The per-cell steps run in it too.
PARTS = (
    # first: gloo writes to fds 1 and 2 from C as its backends connect, at the first collective
    Part("gloo's chatter", lambda _: chatter.install()),
    Part("sharding pictures", lambda _: sharding.install()),
    # the notebook's cell number is noted before any other step of a cell, whose warnings and
    # tracebacks then name it
    Part("cell numbers", _with_shell(cells.install),
         new_cell=lambda session: cells.new_cell(session.shell)),
    Part("the stack JAX records", _with_shell(tracebacks.install)),
    # numbering before the dispatch record: it plans what numbers each program's outputs
    # (``dispatch.output_planners``), asked at a program's first call
    Part("global values", lambda _: values.install(),
         new_cell=lambda session: values.new_cell(cells.order(session.shell)),
         cell_ended=lambda _: values.cell_ended()),
    # reads name arrays to their owners by values' numbers; the shards are served once reads
    # can ask for them
    Part("global reads", lambda _: reads.install()),
    Part("the link and its shard service", EngineSession.open_link),
    Part("dispatch record", lambda _: dispatch.install(), new_cell=lambda _: dispatch.new_cell()),
    Part("stdin", lambda session: stdin.install(session.shell)),
    Part("pushes settled", lambda _: None, new_cell=lambda _: data.settle()),
    Part("a script's initialize", lambda session: scripts.install(session.gpus)),
    # last: the per-cell hook, once every part it calls is in
    Part("per-cell hook", EngineSession.hook_cells),
)
STARTING_A_CELL = [part.new_cell for part in PARTS if part.new_cell is not None]
ENDING_A_CELL = [part.cell_ended for part in PARTS if part.cell_ended is not None]

_session: list[EngineSession] = []  # this engine's, once started


def start(address: str | None = None, gpus: list[int] | None = None,
          machine: str | None = None) -> dict[str, str] | None:
    """Install this engine's hooks, once, and say where its link listens (``link_end``)."""
    if not _session:
        session = EngineSession(address, gpus, machine)
        session.install()
        _session.append(session)
    return _session[0].link
