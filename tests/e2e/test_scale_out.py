"""The pieces that let a run span nodes without a shared filesystem: folders as values,
the storage copy of a run, role pinning in the placement bundles, and the start-up check
that names a node lacking what environment actors need."""
import pytest
import ray

from actors.http_thread import bind_address
from orchestrator.cluster import bundles, spawn_env_actors
from orchestrator.node_check import NodeNotReady, check_env_node
from orchestrator.storage import RunStorage
from rl.config import RunConfig, load_config
from rl.folders import read_folder, write_folder


def test_a_folder_travels_as_a_value(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "adapter_config.json").write_text("{}")
    (src / "sub" / "w.bin").write_bytes(bytes(range(256)))
    files = read_folder(src)
    assert set(files) == {"adapter_config.json", "sub/w.bin"}
    out = write_folder(files, tmp_path / "dst")
    assert read_folder(out) == files
    for bad in ("../escape", "/etc/passwd", "sub/../../x"):
        with pytest.raises(ValueError, match="not a path inside"):
            write_folder({bad: b""}, tmp_path / "dst2")


@pytest.mark.parametrize("as_uri", [False, True])
def test_a_run_in_storage_comes_back_to_an_empty_run_dir(tmp_path, as_uri):
    run = tmp_path / "node-a" / "myrun"
    (run / "checkpoints" / "step_000002" / "learner").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "learner" / "state.pt").write_bytes(b"\x00" * 1000)
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (run / "adapters" / "step_000002").mkdir(parents=True)  # scratch: not copied
    store = tmp_path / "store"
    uri = store.as_uri() if as_uri else str(store)
    first = RunStorage(uri, run)
    assert not first.has_checkpoint()
    first.push()
    first.push()  # idempotent
    assert first.has_checkpoint()
    elsewhere = tmp_path / "node-b" / "myrun"
    RunStorage(uri, elsewhere).pull()
    assert read_folder(elsewhere) == {k: v for k, v in read_folder(run).items() if not k.startswith("adapters")}


def test_role_resources_pin_each_role_in_its_bundles():
    cfg = load_config(None, ["ray.role_resources.env.cpu_node=0.5", "ray.role_resources.rollout.gpu_node=1",
                             "env.num_env_actors=2", "ray.placement_strategy=STRICT_SPREAD"])
    shapes = bundles(cfg)
    assert shapes["env"] == [{"CPU": 0.5, "cpu_node": 0.5}] * 2
    assert shapes["rollout"] == [{"CPU": 1.0, "gpu_node": 1.0}]
    assert shapes["learner"] == [{"CPU": 1.0}]
    with pytest.raises(ValueError, match="role_resources"):
        load_config(None, ["ray.role_resources.judge.x=1"])


def test_a_node_without_pi_or_sandbox_is_named_with_the_setup_command(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "empty"))
    with pytest.raises(NodeNotReady) as err:
        check_env_node("pi", [])
    msg = str(err.value)
    assert "pi is not installed" in msg and "sandbox Python" in msg and "bash scripts/setup.sh" in msg

    # the same check fails the environment actor itself, at start, with the node's address
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False,
             runtime_env={"env_vars": {"RLVR_HOME": str(tmp_path / "empty")}})
    try:
        assert bind_address("auto", spans_nodes=True) == ray.util.get_node_ip_address()
        with pytest.raises(ray.exceptions.RayActorError, match=r"node [0-9.]+ cannot host environment actors"):
            spawn_env_actors(RunConfig.model_validate({"scaffold": {"name": "pi"}, "env": {"num_cpus": 0.5}}))
    finally:
        ray.shutdown()


def test_the_policy_server_binds_loopback_unless_the_run_spans_nodes():
    assert bind_address("auto", spans_nodes=False) == "127.0.0.1"
    assert bind_address("10.1.2.3", spans_nodes=False) == "10.1.2.3"  # an explicit address is kept
    assert RunConfig().rollout.server_host == "auto"
