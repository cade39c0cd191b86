"""``%spmd_pull`` and ``%spmd_push``, and what all the magics share: the notebook's cluster and
namespace. :class:`jaxcluster.notebook.magics.JaxClusterMagics` registers these as magics.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics
from IPython.core.magic_arguments import argument, magic_arguments

from ..cluster.facade import JaxCluster
from ..data import MeshSharding
from ..render.labels import parse_process_spec
from ..render.transfer import pulled_line, pushed_line
from .magics_args import index, name_argument, parse, process_option, unquote, usage_errors


class ClusterMagicsBase(Magics):
    """The notebook's cluster, its namespace, and the data magics."""

    cluster: JaxCluster | None = None  # the kernel adopts and assigns it too

    @property
    def user_ns(self) -> dict[str, Any]:
        assert self.shell is not None  # registered magics always have their shell
        return self.shell.user_ns

    def require_cluster(self) -> JaxCluster:
        if self.cluster is None or not self.cluster.running:
            raise UsageError(
                "No cluster is running. Start one with %jax_cluster start --nodes N "
                "(e.g. %jax_cluster start --nodes 4)."
            )
        return self.cluster

    @magic_arguments()
    @name_argument("the variable on the processes.")
    @argument("--to", default=None, metavar="LOCAL",
              help="the notebook variable to assign. Default: NAME.")
    @process_option(
        "take the value from this process (jax.Arrays are assembled from all). Default 0.",
        type=index("--process", "; use --all for every process"),
    )
    @argument(
        "--all", action="store_true",
        help="take every process's value: a list indexed by process.",
    )
    @usage_errors
    def spmd_pull(self, line: str) -> None:
        """Copy the processes' variable NAME into the notebook.

        A jax.Array, also inside lists, dicts and other pytrees, arrives as one NumPy array
        assembled from the processes' shards, each distinct shard sent once, even when no
        process holds the whole array. Other values come from process 0, from --process N, or
        from every process with --all.

        Examples::

            %spmd_pull losses
            %spmd_pull params --to p
            %spmd_pull step_time --all
        """
        args = parse(self.spmd_pull, line)
        cluster = self.require_cluster()
        if args.all and args.process is not None:
            raise UsageError("Use --process N or --all, not both.")
        process: int | str = "all" if args.all else 0
        if args.process is not None:
            process = in_range(args.process, cluster)
        target = local_name(args.to or args.name, "--to")
        value = cluster.pull(args.name, process)
        self.user_ns[target] = value
        print(pulled_line(args.name, target, value))

    @magic_arguments()
    @name_argument("the variable to assign on every process.")
    @argument("--from", dest="source", default=None, metavar="LOCAL",
              help="the notebook variable to send. Default: NAME.")
    @argument(
        "--mesh", default=None, metavar="AXES",
        help="a mesh over all global devices, in jax.devices() order: NAME=SIZE per axis, "
        "e.g. --mesh data=4,model=2. Needs --spec.",
    )
    @argument(
        "--spec", default=None, metavar="SPEC",
        help="the PartitionSpec on that mesh, one entry per dimension: an axis, None, or "
        "axes joined by +, e.g. --spec data,None. Needs --mesh.",
    )
    @usage_errors
    def spmd_push(self, line: str) -> None:
        """Send a notebook value to every process as NAME (on all of them, or on none).

        Without --mesh/--spec every process receives the whole value. With them the value
        (array-like) becomes a global jax.Array with that sharding, and each process receives
        only the slices its devices hold.

        Examples::

            %spmd_push config
            %spmd_push batch --mesh data=8 --spec data
            %spmd_push w --from w_init --mesh data=4,model=2 --spec None,model
        """
        args = parse(self.spmd_push, line)
        cluster = self.require_cluster()
        mesh, spec = unquote(args.mesh), unquote(args.spec)
        if (mesh is None) != (spec is None):
            raise UsageError("--mesh and --spec go together, e.g. --mesh data=8 --spec data.")
        source = local_name(args.source or args.name, "--from")
        if source not in self.user_ns:
            raise UsageError(f"{source!r} is not defined in the notebook.")
        sharding = None
        if mesh is not None and spec is not None:
            sharding = MeshSharding.parse(mesh, spec)
        value = self.user_ns[source]
        cluster.push(args.name, value, sharding)
        print(pushed_line(source, args.name, value, args.mesh, args.spec))


def process_spec(spec: str, cluster: JaxCluster, option: str) -> list[int]:
    try:
        return parse_process_spec(spec, len(cluster.processes))
    except ValueError as e:
        raise UsageError(f"{option}: {e}") from None


def in_range(process: int, cluster: JaxCluster) -> int:
    return process_spec(str(process), cluster, "--process")[0]


def local_name(name: str, option: str) -> str:
    if not name.isidentifier():
        raise UsageError(f"{option} takes a variable name, not {name!r}.")
    return name
