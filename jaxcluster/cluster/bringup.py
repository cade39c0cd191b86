"""From a launch plan to engines up: controller, watchdog, client, engines registered.

One deadline, the cluster's timeout from the start's first step, bounds the whole start
(launching included), and an engine that ends before registering fails the start at once,
with its output. ``jax.distributed`` on the engines is ``distributed.py``'s part.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import signal
import subprocess
import time
import warnings
from dataclasses import dataclass
from typing import Any

import ipyparallel as ipp
import psutil

from ..cells.process_calls import ask_engines
from ..contracts import Progress
from ..engine import process as _engine
from ..errors import JaxClusterError
from ..render.labels import awaited
from . import controller, engine_sets, watchdog
from .event_loop import LoopThread
from .host_sessions import HostSessions
from .hosts import engines_by_host
from .launchers import Launcher, launcher_named
from .options import ClusterOptions

# beyond the cluster's timeout, for ipyparallel's own steps when stopping
MARGIN_SECONDS = 30
# seconds the hosts get to say who they are, when an error is named by host
IDENTIFY_SECONDS = 5
CONTROLLER_TRIES = 3  # starts of a controller that exits, or is silent, before it is ready
# for a serving controller to answer the client, but on the last try (the rest of the start's)
ANSWER_SECONDS = 30
STACKS_SECONDS = 2  # for a silent controller to write its threads' stacks
REGISTRATION_POLL_SECONDS = 1  # a registration ipyparallel did not tell is seen within this


@dataclass
class Launched:
    """An ``ipyparallel.Cluster`` we start, and what we keep about it."""

    ipp_cluster: ipp.Cluster
    launcher: Launcher
    controller_ip: str
    # the lines to each host's forking process, where engines are forked per host
    # (forked_engines.py): opened with the controller, kept across restarts
    sessions: HostSessions | None = None
    client: ipp.Client | None = None
    work_dir: str | None = None  # private to this start: the watchdog removes it too
    watchdog: subprocess.Popen | None = None
    # a kept cluster's keeper (``kept.Kept``), which holds the lines and outlives this kernel
    kept: Any = None
    # engines another kernel started (this one attached to a kept cluster): their pids, as
    # their hosts number them, for the restart that replaces them
    inherited: list[int] | None = None


def plan(options: ClusterOptions, work_dir: str, kept: Any = None,
         taken_over: str | None = None) -> Launched:
    """The cluster as planned (nothing runs yet); raises what cannot work. With ``kept`` (a
    keeper), the lines are the keeper's, and nothing stops the cluster as this process exits;
    ``taken_over``: the id of the kept cluster that this kernel attached to, whose lines it
    takes over from the keeper."""
    launcher = launcher_named(options.launcher)
    launch = launcher.plan(options.launch_request(work_dir))
    cluster = ipp.Cluster(
        n=options.nodes,
        engines=launch.engine_launcher,
        controller_ip=launch.controller_ip,
        controller_args=launch.controller_args,
        delay=0,
        log_level=logging.ERROR,
        engine_timeout=int(options.timeout),
        config=launch.config,
        shutdown_atexit=kept is None,
        **({"profile_dir": options.profile_dir} if options.profile_dir else {}),
        **({"cluster_id": taken_over} if taken_over else {}),
    )
    if kept is not None and not taken_over:
        # what its keeper ends when told to stop, should this start fail before it is told the
        # rest (``reattach.publish``): the stop leaves the controller to it
        kept.update(cluster_file=cluster.cluster_file, cluster_id=cluster.cluster_id,
                    launcher=options.launcher, work_dir=work_dir)
    sessions = None
    if launch.fork is not None:
        spawn = None if kept is None else kept.relay if taken_over else kept.line
        sessions = HostSessions(launch.fork, {"IPP_CLUSTER_ID": cluster.cluster_id,
                                              "IPP_PROFILE_DIR": cluster.profile_dir},
                                spawn=spawn, errors_dir=work_dir)
    return Launched(cluster, launcher, launch.controller_ip, sessions, kept=kept,
                    work_dir=work_dir)


def deadline_for(options: ClusterOptions) -> float:
    """The ``time.monotonic()`` by which a start beginning now must be done."""
    return time.monotonic() + options.timeout


def remaining(deadline: float, options: ClusterOptions, what: str) -> float:
    """Seconds left before ``deadline``, or a ``JaxClusterError`` saying the start ran out."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise overdue(options, what)
    return left


def overdue(options: ClusterOptions, what: str, detail: str = "") -> JaxClusterError:
    """The error of a start that ran out of time while it tried ``what``."""
    return JaxClusterError(
        f"Could not {what}: the start took longer than --timeout {options.timeout:g} s. "
        "The machine may be overloaded; raise --timeout or lower --nodes."
        + (f"\n{detail}" if detail else "")
    )


def start_controller(
    launched: Launched,
    options: ClusterOptions,
    loop: LoopThread,
    deadline: float,
    progress: Progress | None = None,
) -> None:
    """The watchdog (for when this process dies; first, to see every process of the cluster),
    the line to each host, whose forking process imports JAX meanwhile, controller and client."""
    cluster = launched.ipp_cluster
    launched.watchdog = watchdog.start(
        cluster.cluster_file, cluster.cluster_id, launched.launcher.name,
        int(launched.kept.record["pid"]) if launched.kept else None, launched.work_dir)
    if launched.sessions is not None:
        launched.sessions.progress = progress  # "hosts reached" comes meanwhile
        launched.sessions.open()
    _controller_and_client(launched, options, loop, deadline)


def _controller_and_client(launched: Launched, options: ClusterOptions, loop: LoopThread,
                           deadline: float) -> None:
    """A controller and a client of it; one that exits or is silent before it is ready is
    replaced, ``CONTROLLER_TRIES`` times."""
    cluster = launched.ipp_cluster
    for attempt in range(1, CONTROLLER_TRIES + 1):
        what = "start the controller"
        loop.run(cluster.start_controller(), remaining(deadline, options, what), what)
        # ipyparallel writes it with the default umask; it names hosts, pids and ssh options
        # (and removes it at once if the controller has already exited)
        with contextlib.suppress(FileNotFoundError):
            os.chmod(cluster.cluster_file, 0o600)
        what = "connect to the controller"
        last = attempt == CONTROLLER_TRIES
        bound = remaining(deadline, options, what)  # not the client's own 10 s for an answer
        if not last:
            bound = min(bound, ANSWER_SECONDS)
        try:
            left = controller.wait_until_serving(cluster.controller, bound)
            launched.client = loop.run(cluster.connect_client(timeout=max(left, 1)), bound, what)
            return
        except (RuntimeError, TimeoutError) as e:  # JaxClusterError: no answer within bound
            ended = _has_exited(cluster.controller)
            if not ended and not isinstance(e, (TimeoutError, JaxClusterError)):
                raise
            failure, account = _exited(cluster) if ended else _silent(cluster, bound, loop)
            _stop_controller(cluster, loop, remaining(deadline, options, what), what)
            if last:
                raise JaxClusterError(f"{failure}, {attempt} times. {account}") from None
            if not ended:  # rare: say so, with where it was, and start another
                warnings.warn(f"{failure}; another one starts. {account}", RuntimeWarning,
                              stacklevel=2)


def _stop_controller(cluster: ipp.Cluster, loop: LoopThread, bound: float, what: str) -> None:
    """Stop a controller that exited or is silent; its connection files, named by the cluster
    id, go too: the next one's client would read them before that one wrote its own."""
    files = cluster.controller.connection_files.values() if cluster.controller else []
    loop.run(cluster.stop_controller(), bound, what)
    for path in files:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _exited(cluster: ipp.Cluster) -> tuple[str, str]:
    """Why a controller that exited before it was ready did (ipyparallel draws its ports by
    binding and letting go of them, so another process may take one first: a new controller
    draws new ones), and its account."""
    launcher = cluster.controller
    ended = launcher is not None and _has_exited(launcher)
    status = (launcher.stop_data or {}).get("exit_code") if ended else None
    output = launcher.get_output() if launcher else ""
    return (f"The cluster's controller exited (status {status}) before it was ready",
            f"It wrote:\n{output[-2000:].strip() or '(nothing)'}")


def _has_exited(launcher: Any) -> bool:
    """Whether the controller's process has ended, noted now where ipyparallel has not yet (its
    wait thread tells the loop, which a client's connect may hold for seconds)."""
    try:
        return launcher is None or not launcher.running or launcher.poll() is not None
    except psutil.Error:  # reaped by that wait thread already
        return True


def _silent(cluster: ipp.Cluster, waited: float, loop: LoopThread) -> tuple[str, str]:
    """A controller that runs but has not answered the client, and its account: which of
    ipyparallel's two waits it was (for its connection files, for its answer), where this
    process's client waited, and every thread's stack (``controller.py`` dumps them on SIGUSR1)
    in the controller's output."""
    controller = cluster.controller
    files = list(controller.connection_files.values())
    which = ("It never wrote its connection files" if not all(map(os.path.exists, files))
             else "It wrote its connection files, but the client got no answer")
    output = controller_stacks(controller)
    return (f"The cluster's controller did not answer within {waited:g} s",
            f"{which}. The client waited in:\n{loop.last_overrun[-1500:]}"
            f"The controller wrote:\n{output[-4000:].strip() or '(nothing)'}")


def controller_stacks(controller: Any) -> str:
    """A running controller's output once it has written every thread's stack after it
    (``controller.py``; not within ``STACKS_SECONDS``: a stopped or wedged one), or as it is.
    Read from its file: ipyparallel's ``get_output`` keeps the first reading."""
    with contextlib.suppress(psutil.Error):  # one that ends meanwhile writes nothing more
        controller.signal(signal.SIGUSR1)
    written = time.monotonic() + STACKS_SECONDS
    output, before = _output_of(controller), None
    while ("most recent call first" not in output or output != before) and (
            time.monotonic() < written):
        time.sleep(0.05)
        output, before = _output_of(controller), output
    return output


def _output_of(controller: Any) -> str:
    try:
        with open(controller.output_file, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


@dataclass
class Registered:
    """A start's engines, once all have registered, and where each runs: asked of each as it
    registered (the future of ``engine.process.identity``), so that the question is
    not one more round trip after the last one."""

    engine_ids: list[int]  # in registration order
    identities: dict[int, Any]


def start_engines(
    launched: Launched,
    options: ClusterOptions,
    loop: LoopThread,
    progress: Progress | None,
    deadline: float,
) -> Registered:
    """Start the engines; done once all have registered. A controller that exits meanwhile
    (``controller.py``: a part's port was taken) is replaced, and the engines started again
    for the new one, ``CONTROLLER_TRIES`` times; ``launched.client`` is then the new one's."""
    attempt = 1
    while (registered := _engines_registered(launched, options, loop, progress, deadline)) is None:
        failure, account = _exited(launched.ipp_cluster)
        if attempt == CONTROLLER_TRIES:
            raise JaxClusterError(f"{failure}, {attempt} times. {account}")
        attempt += 1
        stop_engines(launched, options, loop)
        if launched.client is not None:
            launched.client.close()
        what = "start another controller"
        _stop_controller(launched.ipp_cluster, loop, remaining(deadline, options, what), what)
        _controller_and_client(launched, options, loop, deadline)
    return registered


def _engines_registered(launched: Launched, options: ClusterOptions, loop: LoopThread,
                        progress: Progress | None, deadline: float) -> Registered | None:
    """The engines started and registered; None when the controller exited first."""
    cluster, client = launched.ipp_cluster, launched.client
    assert client is not None
    known = set(client.ids)
    what = "start the engines"
    left = remaining(deadline, options, what)
    # the forked engine set reports each host's progress and names the hosts behind itself
    forked = {} if launched.sessions is None else {
        "sessions": launched.sessions, "progress": progress, "start_timeout": left}
    try:
        loop.run(cluster.start_engines(options.nodes, **forked), left + MARGIN_SECONDS, what)
    except JaxClusterError:
        raise
    except Exception as e:
        raise JaxClusterError(f"Could not start the engines: {e}") from None
    return _registered(launched, known, options, progress, deadline)


def stop_engines(launched: Launched, options: ClusterOptions, loop: LoopThread) -> None:
    """End the engines (the controller stays)."""
    cluster = launched.ipp_cluster
    launched.launcher.kill_engines(
        cluster, lambda c: loop.run(c, options.timeout, "signal the engines"))
    if launched.inherited and launched.sessions is not None:
        launched.sessions.kill_engines(launched.inherited)
        launched.inherited = None
    loop.run(cluster.stop_engines(), options.timeout + MARGIN_SECONDS, "stop the engines")


def shut_down(launched: Launched, options: ClusterOptions, loop: LoopThread) -> None:
    """End engines, controller and watchdog; whatever ipyparallel does not stop in time is
    killed the way the watchdog would kill it."""
    cluster = launched.ipp_cluster
    if launched.client is not None:
        launched.client.close()
    if launched.kept is not None:  # the keeper's to end (``JaxCluster.stop`` asks it)
        watchdog.stop(launched.watchdog)
        return
    try:
        launched.launcher.kill_engines(
            cluster, lambda c: loop.run(c, options.timeout, "signal the engines")
        )
        loop.run(cluster.stop_cluster(), options.timeout + MARGIN_SECONDS, "stop the cluster")
    except JaxClusterError:
        with contextlib.suppress(OSError):
            cluster.update_cluster_file()
        watchdog.kill_cluster(cluster.cluster_file, launched.launcher.kill_leftovers)
    finally:
        if launched.sessions is not None:  # each host's forking process ends with its line
            launched.sessions.close()
        if launched.launcher.engines_share_host:  # engines launched after the last file update
            watchdog.kill_local(cluster.cluster_id)
        watchdog.stop(launched.watchdog)
        launched.watchdog = None


def _registered(
    launched: Launched,
    known: set[int],
    options: ClusterOptions,
    progress: Progress | None,
    deadline: float,
) -> Registered | None:
    """The new engines once ``options.nodes`` have registered; fail fast on ended ones; None
    once the controller has exited. Progress names the hosts still short of engines, by the
    identities answered so far."""
    client = launched.client
    assert client is not None
    ended = engine_sets.any_engine_ends(launched.ipp_cluster)
    controller_ended = engine_sets.launcher_ends(launched.ipp_cluster.controller)
    asked: dict[int, Any] = {}
    expected = _expected(options) if options.hosts else {}
    reported: tuple[int, str] | None = None
    one_more: concurrent.futures.Future[None] | None = None
    while True:
        ids = set(client.ids)  # one snapshot: the wait below is for one more than these
        new = sorted(ids - known)
        asked |= ask_engines(client, {eid: (_engine.identity, (launched.controller_ip,))
                                      for eid in new if eid not in asked})
        report = (min(len(new), options.nodes), awaited(_hosts_behind(asked, expected)))
        if progress and report != reported:
            reported = report
            progress("engines registered", report[0], options.nodes, report[1])
        if len(new) >= options.nodes:
            chosen = new[: options.nodes]
            return Registered(chosen, {eid: asked[eid] for eid in chosen})
        if controller_ended.done():
            return None
        if ended.done():
            _raise_exited(launched, options)
            # a set that ended without a record of its engines (a batch job): wait it out
            ended = concurrent.futures.Future()
        left = deadline - time.monotonic()
        if left <= 0:
            _raise_short(launched, new, asked, options)
        # one more engine than the snapshot (or an old one unregistering after a restart);
        # one such wait at a time, kept until it settles. ipyparallel tells a registration to
        # its waits in a list that the first one it settles leaves, and the wait behind never
        # hears it: the snapshot is looked at again every REGISTRATION_POLL_SECONDS, so a
        # missed registration cannot hold a start with every engine registered to --timeout
        if one_more is None or one_more.done():
            one_more = client.wait_for_engines(
                len(ids) + 1, timeout=left, block=False, interactive=False
            )
        # on other hosts an answered identity may also name a host that has all its engines
        answers = [ar for ar in asked.values() if not ar.done()] if expected else []
        concurrent.futures.wait(
            [one_more, ended, controller_ended, *answers],
            timeout=min(left, REGISTRATION_POLL_SECONDS),
            return_when=concurrent.futures.FIRST_COMPLETED,
        )


def _hosts_behind(asked: dict[int, Any], expected: dict[str, int]) -> list[str]:
    """The hosts with fewer engines than ``expected`` among those that answered ``asked``."""
    found: dict[str, int] = {}
    for ar in asked.values():
        # an engine that cannot answer counts as missing
        if ar.done() and ar.exception() is None:
            host = ar.result()["host"]
            found[host] = found.get(host, 0) + 1
    return [host for host, n in expected.items() if found.get(host, 0) < n]


def _raise_exited(launched: Launched, options: ClusterOptions) -> None:
    cluster = launched.ipp_cluster
    exited = engine_sets.exited_engines(cluster)
    if not exited:
        return  # ipyparallel noticed the end and records it in a moment; the loop asks again
    hosts = sorted({engine_sets.launch_host(data) for data, _ in exited} - {""})
    refusal = launched.launcher.ended_note(cluster)  # the cause and its fix lead, when known
    raise JaxClusterError(
        (f"{refusal}\n" if refusal else "")
        + f"{len(exited)} engine(s) exited before registering with the controller"
        f"{' on ' + ', '.join(hosts) if hosts else ''}.{reach_hint(launched, options)} "
        "Their output:\n" + "\n".join(engine_sets.exited_engine_output(
            cluster, launched.launcher.output_reasons))
    )


def _raise_short(
    launched: Launched, new: list[int], asked: dict[int, Any], options: ClusterOptions
) -> None:
    concurrent.futures.wait([asked[eid] for eid in new], timeout=IDENTIFY_SECONDS)
    short = _hosts_behind(asked, _expected(options)) if options.hosts else []
    raise JaxClusterError(
        f"Only {len(new)} of {options.nodes} engines registered within {options.timeout:g} s"
        f"{' (missing on ' + ', '.join(short) + ')' if short else ''}. "
        + launched.launcher.waiting_note(launched.ipp_cluster)
        + f"Raise --timeout if the hosts are slow to start.{reach_hint(launched, options)}"
    )


def _expected(options: ClusterOptions) -> dict[str, int]:
    return engines_by_host(options.nodes, options.hosts, options.engines_per_host)


def reach_hint(launched: Launched, options: ClusterOptions) -> str:
    if not options.hosts:
        return ""
    return (
        f" Engines connect back to the controller at {launched.controller_ip}: check that "
        "every host can reach that address (routes, firewall), or choose another with --ip."
    )
