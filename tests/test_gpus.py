"""Which GPUs each process takes (``cluster/gpus.py``), from a host's count of visible GPUs as
``engine/accelerators.py`` reads it, faked here: no GPU is needed. The real start path on this
machine, which shows none, is in the last tests."""

from __future__ import annotations

import json

import pytest

from jaxcluster import ConfigError, JaxCluster
from jaxcluster.cluster.distributed import hosts_of
from jaxcluster.cluster.gpus import Host, plan
from jaxcluster.engine.accelerators import visible_gpus

H200 = "NVIDIA H200"


def one_host(gpus: int, processes: int, plugin: bool = True) -> list[Host]:
    return [Host("gpu-1", list(range(processes)), [H200] * gpus, plugin)]


# (GPUs on the host, processes on it) -> each process's local_device_ids, "refused", or "cpu"
# (the processes fall back to CPU devices), for --platform cuda and for no --platform
CASES = {
    (0, 1): ([None], [None]),  # no GPU shown: left to JAX, whose error is the clearer
    (0, 4): ([None] * 4, [None] * 4),
    (1, 1): ([None], [None]),  # a host's only process: JAX's default, every GPU it sees
    (1, 2): ("refused", "cpu"),
    (1, 4): ("refused", "cpu"),
    (1, 8): ("refused", "cpu"),
    (2, 1): ([None], [None]),
    (2, 2): ([[0], [1]], [[0], [1]]),
    (2, 4): ("refused", "cpu"),
    (8, 1): ([None], [None]),
    (8, 2): ([[0], [1]], [[0], [1]]),
    (8, 4): ([[0], [1], [2], [3]], [[0], [1], [2], [3]]),
    (8, 8): ([[i] for i in range(8)], [[i] for i in range(8)]),
}


@pytest.mark.parametrize(("gpus", "processes"), sorted(CASES))
@pytest.mark.parametrize("platform", ["cuda", None])
def test_the_processes_of_a_host_divide_its_gpus(gpus, processes, platform):
    expected = CASES[gpus, processes][0 if platform else 1]
    hosts = one_host(gpus, processes)
    if expected == "refused":
        with pytest.raises(ConfigError) as refused:
            plan(hosts, platform, None, False, 2)
        said = str(refused.value)
        assert said.startswith(f"Host gpu-1 shows {gpus} GPU{'s' if gpus > 1 else ''} "
                               f"({H200}), and its {processes} processes need {processes}")
        assert f"Start at most {gpus} process" in said and "--platform cpu" in said
        assert "--allow-shared-gpu" in said and "\n" not in said
        return
    made = plan(hosts, platform, None, False, 2)
    if expected == "cpu":
        assert made.platform == "cpu"
        assert made.devices == {i: None for i in range(processes)}
        [notice] = made.notes
        assert notice.startswith(f"Host gpu-1 shows {gpus} GPU")
        assert "run on 2 CPU devices each instead" in notice and "--platform cpu" in notice
        return
    assert made.platform is None
    assert [made.devices[i] for i in range(processes)] == expected
    if gpus:
        assert made.notes[0].startswith("Process 0 holds GPU")
        assert f"({H200})" in made.notes[0]
    else:
        assert made.notes == []


def test_devices_per_node_gpus_each_and_the_refusal_counts_them():
    made = plan(one_host(8, 4), "cuda", 2, False, 2)
    assert [made.devices[i] for i in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert made.notes == [f"Process 0 holds GPUs 0-1 ({H200}); process 1 holds GPUs 2-3 "
                          f"({H200}); process 2 holds GPUs 4-5 ({H200}); process 3 holds "
                          f"GPUs 6-7 ({H200})."]
    # one process, two GPUs asked for, one GPU there: the issue's --nodes 1 case
    with pytest.raises(ConfigError) as refused:
        plan(one_host(1, 1), "cuda", 2, False, 2)
    assert str(refused.value).startswith(
        f"Host gpu-1 shows 1 GPU ({H200}), and its 1 process needs 2 for --platform cuda, 2 each "
        "(--devices-per-node): processes would share a GPU, which NCCL refuses at their first "
        "collective. Start one process on that host with --devices-per-node 1 or fewer")


def test_the_quick_start_on_a_one_gpu_host_runs_on_cpu_with_one_notice():
    made = plan(one_host(1, 4), None, 2, False, 2)
    assert made.platform == "cpu"
    assert made.notes == [
        f"Host gpu-1 shows 1 GPU ({H200}) for 4 processes, 2 each (--devices-per-node): the "
        "processes run on 2 CPU devices each instead. Give --platform cpu to choose that "
        "without this notice, or --platform cuda with one process on that host with "
        "--devices-per-node 1 or fewer for GPUs of their own."]


def test_the_notice_counts_one_cpu_device_as_one():
    [notice] = plan(one_host(1, 2), None, 1, False, 1).notes
    assert "the processes run on 1 CPU device each instead." in notice


def test_without_a_gpu_plugin_jax_would_not_use_the_gpus_so_nothing_changes():
    made = plan(one_host(1, 4, plugin=False), None, None, False, 2)
    assert made.platform is None and made.notes == []
    assert made.devices == {i: None for i in range(4)}


def test_cpu_and_tpu_leave_the_gpus_alone():
    for platform in ("cpu", "tpu"):
        made = plan(one_host(1, 4), platform, None, False, 2)
        assert made.platform is None and made.notes == []


def test_allow_shared_gpu_starts_and_says_collectives_will_fail():
    made = plan(one_host(1, 4), "cuda", None, True, 2)
    assert [made.devices[i] for i in range(4)] == [[0]] * 4
    assert made.platform is None
    assert made.notes[-1].startswith("GPUs are shared (--allow-shared-gpu): a collective across "
                                     "processes will fail")


def test_each_host_divides_its_own_gpus():
    hosts = [Host("a", [0, 1], [H200] * 2, True), Host("b", [2, 3], [H200] * 2, True)]
    made = plan(hosts, "cuda", None, False, 2)
    assert made.devices == {0: [0], 1: [1], 2: [0], 3: [1]}
    many = [Host(f"h{k}", [2 * k, 2 * k + 1], [H200] * 8, True) for k in range(8)]
    made = plan(many, "cuda", None, False, 2)
    assert made.notes == [f"Each of the 16 processes holds 1 GPU of its host ({H200})."]


def test_the_gpus_a_host_shows_are_read_from_the_driver_and_narrowed_as_cuda_does(tmp_path):
    nvidia = tmp_path / "gpus"
    for bus in ("0000:1b:00.0", "0000:2c:00.0", "0000:3d:00.0"):
        (nvidia / bus).mkdir(parents=True)
        (nvidia / bus / "information").write_text(f"Model: \t\t {H200}\nIRQ:   42\n")
    none = tmp_path / "none"

    def seen(**environ: str) -> list[str]:
        return visible_gpus(environ, str(nvidia), str(none), str(none))

    assert seen() == [H200] * 3
    assert seen(CUDA_VISIBLE_DEVICES="2,0") == [H200] * 2
    assert seen(CUDA_VISIBLE_DEVICES="1,7,0") == [H200]  # CUDA stops at the first it lacks
    assert seen(CUDA_VISIBLE_DEVICES="") == [] == seen(CUDA_VISIBLE_DEVICES="-1")
    assert seen(CUDA_VISIBLE_DEVICES="GPU-5d3c1b2a") == [H200]
    devices = tmp_path / "dev"
    devices.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (devices / name).touch()
    assert visible_gpus({}, str(none), str(devices), str(none)) == ["NVIDIA GPU"] * 2
    kfd = tmp_path / "kfd"
    for node, gpu_id in (("0", "0"), ("1", "4325"), ("2", "8812")):
        (kfd / node).mkdir(parents=True)
        (kfd / node / "gpu_id").write_text(gpu_id + "\n")
    assert visible_gpus({}, str(none), str(none), str(kfd)) == ["AMD GPU"] * 2
    assert visible_gpus({"ROCR_VISIBLE_DEVICES": "1"}, str(none), str(none), str(kfd)) == [
        "AMD GPU"]


def test_this_machine_shows_no_gpu_and_a_cpu_cluster_says_nothing_of_gpus():
    assert visible_gpus() == []
    with JaxCluster(nodes=2, devices_per_node=1, platform="cpu", timeout=60,
                    engine_env={"CUDA_VISIBLE_DEVICES": "0"}) as cluster:
        summary = cluster.summary()
        assert summary.startswith("2 processes × 1 cpu devices = 2 global devices")
        assert "GPU" not in summary
        # what the start path reads of each real engine: its GPUs and what narrows them
        result = cluster.run("import json\nfrom jaxcluster.engine.process import identity\n"
                             "print(json.dumps(identity()))").check()
        identities = {i: json.loads(p.stdout) for i, p in enumerate(result.processes)}
        [host] = hosts_of([0, 1], identities)
        assert (host.processes, host.gpus) == ([0, 1], [])
        assert identities[0]["gpu_view"] == "CUDA_VISIBLE_DEVICES=0"


def shows_gpus(count: int):
    """``distributed.hosts_of`` as it would be if this machine showed ``count`` H200s."""
    from jaxcluster.cluster import distributed

    real = distributed.hosts_of

    def faked(engine_ids, identities):
        return [Host(h.name, h.processes, [H200] * count, True)
                for h in real(engine_ids, identities)]

    return faked


def test_a_start_that_a_host_has_too_few_gpus_for_is_refused_and_leaves_nothing(monkeypatch):
    from jaxcluster.cluster import distributed
    from tests.conftest import cluster_processes, wait_until_gone

    monkeypatch.setattr(distributed, "hosts_of", shows_gpus(1))
    cluster = JaxCluster(nodes=2, platform="cuda", timeout=60)
    with pytest.raises(ConfigError) as refused:
        cluster.start()
    assert str(refused.value).startswith(f"Host {cluster_host()} shows 1 GPU ({H200}), and its 2 "
                                         "processes need 2 for --platform cuda")
    assert not cluster.running and cluster.cluster_id
    left = cluster_processes(cluster.cluster_id)
    assert wait_until_gone([p.pid for p in left], 10) == []


def test_too_few_gpus_without_a_platform_start_on_cpu_devices_and_say_so(monkeypatch):
    from jaxcluster.cluster import distributed

    monkeypatch.setattr(distributed, "hosts_of", shows_gpus(1))
    with JaxCluster(nodes=2, devices_per_node=2, timeout=60) as cluster:
        first, notice = cluster.summary().splitlines()[:2]
        assert first.startswith("2 processes × 2 cpu devices = 4 global devices")
        assert notice.startswith(f"Host {cluster_host()} shows 1 GPU ({H200}) for 2 processes, "
                                 "2 each (--devices-per-node): the processes run on 2 CPU "
                                 "devices each instead.")
        # set on every process before its backend started: JAX's choice would be the GPUs
        ran = cluster.run("import jax\nprint(jax.config.jax_platforms, jax.default_backend())")
        assert {p.stdout for p in ran.check().processes} == {"cpu cpu\n"}


def cluster_host() -> str:
    from jaxcluster.engine.process import host_name

    return host_name()
