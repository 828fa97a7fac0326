"""Config: good files, each kind of bad file, and the embedded default."""

from pathlib import Path

import pytest

from janusd.config import (
    DEFAULT_CONFIG_TOML,
    ConfigError,
    JanusConfig,
    dump_config,
    load_config,
    parse_config,
)

REPO = Path(__file__).resolve().parents[1]

GOOD = """
[server]
port = 9100
api_keys = ["k1", "k2"]

[devices]
count = 4
memory_mib = 4096

[dispatch]
requeue = "relax"
relax_factor = 2.0

[[models]]
name = "a"
checkpoint = "/models/a"
ttft_slo_ms = 500
devices = [0, 3]

[[models]]
name = "b"
checkpoint = "demo:qwen3-tiny"
dtype = "bfloat16"
"""


def test_good_file_round_trips(tmp_path):
    p = tmp_path / "good.toml"
    p.write_text(GOOD)
    cfg = load_config(p)
    assert cfg.server.port == 9100
    assert cfg.server.api_keys == ["k1", "k2"]
    assert cfg.server.host == "127.0.0.1"  # default kept
    assert cfg.devices.count == 4 and cfg.devices.memory_mib == 4096
    assert cfg.dispatch.requeue == "relax" and cfg.dispatch.relax_factor == 2.0
    assert [m.name for m in cfg.models] == ["a", "b"]
    assert cfg.model("a").ttft_slo_ms == 500.0
    assert cfg.model("a").devices == [0, 3]
    assert cfg.model("b").dtype == "bfloat16"
    assert cfg.model("b").app_name == "b"
    # the printed effective config parses back to the same value
    assert parse_config(dump_config(cfg)) == cfg


def test_embedded_default_is_etc_janusd_toml():
    assert (REPO / "etc" / "janusd.toml").read_text() == DEFAULT_CONFIG_TOML
    cfg = load_config(None)
    assert isinstance(cfg, JanusConfig)
    assert cfg.devices.kind == "cpu" and cfg.devices.count == 2
    names = [m.name for m in cfg.models]
    assert names == ["smollm2-135m-instruct", "demo-llama", "demo-qwen2"]
    assert cfg.model("smollm2-135m-instruct").checkpoint == "builtin:smollm2-135m-instruct"
    assert cfg.server.host == "127.0.0.1"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[server]\nprot = 1\n", "server.prot: unknown key"),
        ("colour = 'red'\n", "colour: unknown key"),
        ("[devices]\ncount = 'two'\n", "devices.count: Expected `int`, got `str`"),
        ("[devices]\ncount = 0\n", "devices.count: Expected `int` >= 1"),
        ("[server]\nport = 70000\n", "server.port: Expected `int` <= 65535"),
        ("[devices]\nkind = 'tpu'\n", "devices.kind: Invalid enum value 'tpu'"),
        ("[dispatch]\nrelax_factor = 1.0\n", "dispatch.relax_factor"),
        ("[[models]]\ncheckpoint = 'x'\n", "models[0]: Object missing required field `name`"),
        ("[[models]]\nname = 'a'\ncheckpoint = 'x'\nttft_slo_ms = -5\n", "models[0].ttft_slo_ms"),
        ("[[models]]\nname = 'a b'\ncheckpoint = 'x'\n", "models[0].name"),
        (
            "[[models]]\nname = 'a'\ncheckpoint = 'x'\n[[models]]\nname = 'a'\ncheckpoint = 'y'\n",
            "models[1].name: duplicate model name 'a'",
        ),
        ("[[models]]\nname = 'a'\ncheckpoint = 'x'\ndevices = [2]\n", "models[0].devices: device 2 does not exist"),
        ("[[models]]\nname = 'a'\ncheckpoint = 'x'\ntp = 3\n", "models[0].tp: 3 exceeds devices.count = 2"),
        ("[[models]]\nname = 'a'\ncheckpoint = 'x'\ntp = 2\n", "models[0].devices: a tp = 2 model lists the lead device"),
        ("[devices]\nmemory_mib = 1001\n", "devices.memory_mib: must be a multiple"),
        ("[devices]\nmemory_mib = 64\nresident_mib = 128\n", "devices.resident_mib: 128 exceeds devices.memory_mib"),
        ("[devices]\nresident_mib = 3\n", "devices.resident_mib: must be a multiple"),
        ("[server]\napi_keys = ['', 'a']\n", "server.api_keys"),
        ("[server\nport = 1\n", "not valid TOML"),
        ("[devices]\ncpu_cores = [[0]]\n", "devices.cpu_cores: 1 core lists for devices.count = 2"),
        ("[devices]\ncpu_cores = [[0, 1], [1]]\n", "devices.cpu_cores[1]: core 1 is also device 0's"),
        ("[devices]\ncpu_cores = [[0], []]\n", "devices.cpu_cores[1]: empty"),
        ("[devices]\ncpu_cores = [[0], [-1]]\n", "devices.cpu_cores[1][0]: Expected `int` >= 0"),
        ("[devices]\nkind = 'cuda'\ncpu_cores = [[0], [1]]\n", "devices.cpu_cores: pins cpu devices"),
        ("[devices]\nlauncher = 'k8s'\n", "devices.launcher: Invalid enum value 'k8s'"),
        ("[devices]\nlauncher = 'ray'\n[ray]\naddress = '10.0.0.1'\n", "ray.address: '10.0.0.1' is not 'host:port'"),
        ("[devices]\nlauncher = 'ray'\n[ray]\naddress = 'h:99999'\n", "ray.address: 'h:99999' is not 'host:port'"),
        ("[devices]\nlauncher = 'ray'\n[ray]\nlisten_host = ' '\n", "ray.listen_host: empty"),
        ("[ray]\nhead_object_store_mib = 10\n", "ray.head_object_store_mib: Expected `int` >= 78"),
        ("[ray]\nport = 1\n", "ray.port: unknown key"),
        ("[devices]\nlauncher = 'ray'\n[[models]]\nname = 'm'\ncheckpoint = 'demo:llama-tiny'\ntp = 2\ndevices = [0]\n",
         "models[0].tp: 2 under devices.launcher = \"ray\""),
    ],
)
def test_bad_files_name_file_and_key(tmp_path, text, needle):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}: "), msg
    assert needle in msg, msg


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.toml")


def test_config_is_frozen():
    cfg = load_config(None)
    with pytest.raises(AttributeError):
        cfg.server.port = 1  # type: ignore[misc]


def test_lifecycle_start_states_and_protocol_are_checked():
    from janusd.config import ConfigError, parse_config

    base = '[[models]]\nname = "a"\ncheckpoint = "demo:llama-tiny"\ndevices = [0, 1]\n'
    cfg = parse_config(base + "warm_devices = [1]\n")
    assert [cfg.models[0].start_state(d) for d in (0, 1)] == ["active", "warm"]
    for extra, msg in [("warm_devices = [3]\n", "warm_devices: [3] not in devices"),
                       ("cold_devices = [1]\nwarm_devices = [1]\n", "also in warm_devices")]:
        with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("]", r"\]")):
            parse_config(base + extra)
    with pytest.raises(ConfigError, match="devices.transfer_protocol"):
        parse_config('[devices]\ntransfer_protocol = "rdma"\n')
    with pytest.raises(ConfigError, match="lifecycle.copy_streams"):
        parse_config("[lifecycle]\ncopy_streams = 0\n")


def test_pinned_cpu_devices_get_as_many_torch_threads_as_cores():
    from janusd.config import parse_config

    cfg = parse_config("[devices]\ncpu_cores = [[2, 3], [4, 5]]\n")
    assert cfg.devices.cpu_cores == [[2, 3], [4, 5]] and cfg.devices.worker_torch_threads() == 2
    assert parse_config("[devices]\ncpu_cores = [[1], [2]]\ntorch_threads = 3\n").devices.worker_torch_threads() == 3


_TP = "[devices]\ncount = 4\n[[models]]\nname = 'a'\ncheckpoint = 'x'\ntp = 2\n"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("devices = [1]\n", "models[0].devices: 1 is not the lead of an aligned group of tp = 2 devices (leads are "
                            "multiples of 2: lead 0 serves devices 0-1)"),
        ("devices = [4]\n", "models[0].devices: device 4 does not exist"),
        ("devices = [0, 2]\nprefill_devices = [0]\n", "models[0].tp: a tp > 1 instance serves the mixed role only"),
        ("devices = [0]\nwarm_devices = [0]\n", "models[0].warm_devices: a tp > 1 instance cannot start Warm"),
        ("[control]\nmanaged = true\nplace_at_start = false\n",
         "models[0].devices: a tp = 2 model lists the lead device of each of its groups"),
        ("devices = [0, 2]\n[[models]]\nname = 'b'\ncheckpoint = 'y'\ndevices = [1]\n",
         "models[1].devices: device 1 is in the tp = 2 group 0-1 of 'a'; a group's devices are held whole"),
        ("devices = [0]\n[[models]]\nname = 'b'\ncheckpoint = 'y'\n",
         "models[1].devices: with tp > 1 models configured, every model lists its devices"),
        ("devices = [0]\n[[models]]\nname = 'b'\ncheckpoint = 'y'\ntp = 4\ndevices = [0]\n",
         "device 0 is in the tp = 2 group 0-1 of 'a'"),
    ],
)
def test_tp_configs_the_daemon_cannot_serve_are_refused_by_name(tmp_path, extra, needle):
    p = tmp_path / "tp.toml"
    p.write_text(_TP + extra)
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert needle in str(exc.value), str(exc.value)


def test_tp_groups_the_daemon_serves_are_accepted(tmp_path):
    """Two groups of one tp 2 model (leads 0 and 2, one starting cold), a second tp 2 model
    sharing group 0-1 (the same shape), a tp 1 model on a device of its own."""
    p = tmp_path / "tp.toml"
    p.write_text("[devices]\ncount = 5\n[[models]]\nname = 'a'\ncheckpoint = 'x'\ntp = 2\ndevices = [0, 2]\n"
                 "cold_devices = [2]\n[[models]]\nname = 'b'\ncheckpoint = 'y'\ntp = 2\ndevices = [0]\n"
                 "[[models]]\nname = 'c'\ncheckpoint = 'z'\ndevices = [4]\n")
    cfg = load_config(p)
    assert [(m.name, m.tp, m.devices) for m in cfg.models] == [("a", 2, [0, 2]), ("b", 2, [0]), ("c", 1, [4])]



def test_tp_models_the_controller_places_are_accepted(tmp_path):
    """Under control.managed (place_at_start on), a tp 2 model and a tp 1 model need no
    `devices`: the controller starts the group on a free aligned group and packs the rest
    around it (server/steady_start.py); pinned groups beside them keep their rules."""
    p = tmp_path / "tp.toml"
    p.write_text(_TP + "[control]\nmanaged = true\n[[models]]\nname = 'b'\ncheckpoint = 'y'\n"
                 "[[models]]\nname = 'c'\ncheckpoint = 'z'\ntp = 2\ndevices = [2]\n")
    cfg = load_config(p)
    assert [(m.name, m.tp, m.devices) for m in cfg.models] == [("a", 2, []), ("b", 1, []), ("c", 2, [2])]