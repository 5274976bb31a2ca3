"""fashion_mnist_dp/cli/checks.py with any machine's counts: the GPU cases run here without a GPU."""

import subprocess

import pytest
import torch
import yaml
from jsonargparse import ActionConfigFile
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser

from fashion_mnist_dp.cli.app import main
from fashion_mnist_dp.cli.checks import check_devices, import_class, unwritable_reason
from fashion_mnist_dp.runtime import compat
from fashion_mnist_dp.runtime.errors import ConfigError


@pytest.mark.parametrize("devices", [1, "2", 2, -1, "-1", "auto", None, [0, 1], "0,1", "[1]"])
def test_gpu_requests_within_the_visible_gpus_pass(devices):
    assert check_devices(devices, "cuda", cpu_count=2, gpu_count=2) is None  # no error and no warning


@pytest.mark.parametrize("devices, message", [
    (3, "is 3, more GPUs than are visible: 2 visible"),
    ("8", "is 8, more GPUs than are visible"),
    (0, "is 0: give 1 to 2, -1 or auto (every visible GPU), or GPU indices from 0 to 1"),
    (-2, "is -2"),
    ([0, 2], "GPU indices must be distinct and visible"),
    ("0,0", "GPU indices must be distinct and visible"),
])
def test_gpu_requests_beyond_the_visible_gpus_are_refused(devices, message):
    with pytest.raises(ConfigError) as error:
        check_devices(devices, "cuda", cpu_count=64, gpu_count=2)
    assert message in str(error.value) and str(error.value).startswith("trainer.devices (--devices) is ")


@pytest.mark.parametrize("devices", [1, "4", 4, "auto"])
def test_cpu_processes_up_to_the_cores_pass_quietly(devices):
    assert check_devices(devices, "cpu", cpu_count=4, gpu_count=0) is None


@pytest.mark.parametrize("devices", [5, "32"])
def test_more_cpu_processes_than_cores_run_with_a_warning(devices):
    warning = check_devices(devices, "cpu", cpu_count=4, gpu_count=0)
    assert warning.startswith(f"--devices {devices} starts more CPU processes than this machine has cores (4): the "
                              f"ranks share the cores, one thread each, so images/sec will not scale")


@pytest.mark.parametrize("devices, message", [
    (33, "is 33, more than 8 CPU processes per core (this machine has 4): give a number of CPU processes from 1 to 32"),
    (0, "is 0: give a number of CPU processes from 1 to 32 (8 per core)"),
    (-1, "is -1 (every GPU), but the accelerator is cpu"),
    ([0], "a list of GPU indices, but the accelerator is cpu"),
])
def test_cpu_requests_beyond_the_ceiling_are_refused(devices, message):
    with pytest.raises(ConfigError) as error:
        check_devices(devices, "cpu", cpu_count=4, gpu_count=0)
    assert message in str(error.value)


def test_unwritable_reason_leaves_nothing_behind(tmp_path):
    assert unwritable_reason(tmp_path / "new" / "deeper") is None
    assert list(tmp_path.iterdir()) == []
    assert unwritable_reason("/proc/forbidden") == "/proc is not writable (No such file or directory)"
    (tmp_path / "file").write_text("x")
    assert unwritable_reason(tmp_path / "file" / "logs") == f"{tmp_path / 'file'} is a file, not a folder"
    assert unwritable_reason("s3://bucket/runs") is None


def test_a_class_re_exported_from_its_same_named_module_is_the_class_as_jsonargparse_names_it(tmp_path, monkeypatch):
    """pkg/MyCheckpoint.py re-exported as pkg.MyCheckpoint (jsonargparse's name for it): the class, not the module; a
    ModelCheckpoint subclass so named gets the run's checkpoint folder (cli/outputs.py asks this)."""
    (tmp_path / "reexports").mkdir()
    (tmp_path / "reexports" / "__init__.py").write_text("from reexports.MyCheckpoint import MyCheckpoint\n")
    (tmp_path / "reexports" / "MyCheckpoint.py").write_text(
        "from lightning.pytorch.callbacks import ModelCheckpoint\n\n\nclass MyCheckpoint(ModelCheckpoint):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = import_class("reexports.MyCheckpoint")
    assert isinstance(found, type) and found.__name__ == "MyCheckpoint"
    assert import_class("reexports.Missing") is None and import_class("no_such_module.Thing") is None


def test_whole_numbers_of_batch_limits_parse_and_save_as_counts(tmp_path):
    """Lightning's Union[float, int] would read ``1`` as 1.0 (every batch) and save it so in config.yaml."""
    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_lightning_class_args(Trainer, "trainer")
    compat.batch_limits_count_first(parser)
    config = tmp_path / "limits.yaml"
    config.write_text("trainer:\n  limit_val_batches: 3\n  limit_predict_batches: 0.5\n")
    parsed = parser.parse_args(["--trainer.limit_train_batches", "1", "--config", str(config),
                                "--trainer.limit_test_batches=1.0"])
    limits = {stage: parsed.trainer[f"limit_{stage}_batches"] for stage in ("train", "val", "test", "predict")}
    assert limits == {"train": 1, "val": 3, "test": 1.0, "predict": 0.5}
    assert [type(value) for value in limits.values()] == [int, int, float, float]
    saved = yaml.safe_load(parser.dump(parsed))["trainer"]
    assert [type(saved[f"limit_{stage}_batches"]) for stage in ("train", "val", "test", "predict")] == \
        [int, int, float, float]


def test_limit_train_batches_1_trains_one_batch_per_epoch(workdir, fashion_root):
    code = main(["--data_dir", str(fashion_root), "--network", "mlp", "--epochs", "2", "--test_after_fit", "false",
                 "--trainer.limit_train_batches", "1"])
    last = torch.load(next((workdir / "runs").glob("*/*/checkpoints/last.ckpt")), weights_only=True)
    assert code == 0 and last["global_step"] == 2  # one batch in each of 2 epochs (1.0 would be all 2 of 128)


SRUN = {"SLURM_PROCID": "0", "SLURM_JOB_NAME": "train", "SLURM_NNODES": "1"}


@pytest.mark.parametrize("environ, devices, nodes, expected", [
    ({**SRUN, "SLURM_NTASKS": "2"}, 2, 1, "SLURM started 2 tasks without --ntasks-per-node"),  # srun -n 2
    ({**SRUN, "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "4"}, 2, 1, "4 task(s) per node but --devices is 2"),
    ({**SRUN, "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2(x2)", "SLURM_NNODES": "2"}, 2, 1,
     "SLURM allocated 2 node(s) but --num_nodes is 1"),
    ({**SRUN, "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2(x2)", "SLURM_NNODES": "2"}, 2, 2, None),
    ({**SRUN, "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2"}, "0,1", 1, None),
    ({**SRUN, "SLURM_NTASKS": "2", "SLURM_JOB_NAME": "interactive"}, 2, 1, None),  # Lightning's own opt-out
    ({}, 2, 1, None),  # not under SLURM
])
def test_a_slurm_task_layout_that_disagrees_with_the_trainer_is_one_line(environ, devices, nodes, expected):
    from fashion_mnist_dp.cli.checks import parse_devices
    from fashion_mnist_dp.cli.slurm import check_slurm_layout

    found = check_slurm_layout(environ, parse_devices(devices), nodes)
    assert found == expected if expected is None else expected in found


class Environment:
    """Lightning's cluster environment as the rendezvous check reads it."""

    def __init__(self, address: str) -> None:
        self.main_address = address


def scontrol(stdout: str, returncode: int = 0):
    return lambda *args, **kwargs: subprocess.CompletedProcess(args, returncode, stdout=stdout, stderr="")


def test_a_rendezvous_name_that_does_not_resolve_takes_slurms_node_address_and_says_so():
    from fashion_mnist_dp.cli.slurm import rendezvous_address

    environ = {"SLURM_JOB_ID": "7", "SLURM_NODELIST": "fmn[1-2]"}
    shown = scontrol("NodeName=fmn1 Arch=x86_64 CoresPerSocket=1\n   NodeAddr=127.0.0.1 NodeHostName=fmn1 Version=23.11\n")
    address, note = rendezvous_address(Environment("fmn1.invalid"), environ, shown)
    assert (address, environ["MASTER_ADDR"]) == ("127.0.0.1", "127.0.0.1")
    assert note == "  rendezvous      : 127.0.0.1, SLURM's NodeAddr of fmn1.invalid (fmn1.invalid does not resolve here)"
    assert rendezvous_address(Environment("localhost"), {"SLURM_JOB_ID": "7"}, shown) == ("localhost", None)


def test_a_rendezvous_name_nobody_can_resolve_is_one_line_naming_it_and_what_to_set():
    from fashion_mnist_dp.cli.slurm import rendezvous_address

    with pytest.raises(LookupError) as raised:  # SLURM knows the node by its name only
        rendezvous_address(Environment("fmn1.invalid"), {"SLURM_JOB_ID": "7", "SLURM_NODELIST": "fmn1"},
                           scontrol("NodeName=fmn1.invalid NodeAddr=fmn1.invalid\n"))
    assert str(raised.value) == (
        "the rendezvous address fmn1.invalid (the first node of SLURM_NODELIST) does not resolve on this host, and "
        "SLURM knows no address for it: set MASTER_ADDR to the IP address of rank 0's node, or make fmn1.invalid "
        "resolve here (DNS, /etc/hosts)")
    with pytest.raises(LookupError, match=r"^the rendezvous address nowhere.invalid \(MASTER_ADDR\) does not resolve "
                                          r"on this host: set MASTER_ADDR"):
        rendezvous_address(Environment("nowhere.invalid"), {"MASTER_ADDR": "nowhere.invalid"}, scontrol("", 1))


def test_gloo_gets_the_interface_the_kernel_routes_to_the_rendezvous_through_unless_the_user_named_one(monkeypatch):
    """Where the host name resolves to loopback only (Debian's 127.0.1.1) and the rendezvous address does not, gloo
    would offer its peers 127.0.0.1. The route is the kernel's (here to 127.0.0.1, through ``lo``, standing in for a
    rendezvous address elsewhere); GLOO_SOCKET_IFNAME given by the user wins; otherwise gloo's own choice stands."""
    from fashion_mnist_dp.cli import slurm

    monkeypatch.setattr(slurm.socket, "gethostname", lambda: "node7")
    resolved = {"node7": True, "127.0.0.1": False}  # whether each name resolves to loopback only
    monkeypatch.setattr(slurm, "_loopback", lambda host: resolved[host])
    environ = {}
    assert slurm.gloo_interface("127.0.0.1", environ) == \
        "  gloo interface  : lo (routes to 127.0.0.1; GLOO_SOCKET_IFNAME unset, node7 resolves to loopback)"
    assert environ == {"GLOO_SOCKET_IFNAME": "lo"}  # the process group, created later in this process, reads it
    assert slurm.gloo_interface("127.0.0.1", environ) is None and environ == {"GLOO_SOCKET_IFNAME": "lo"}
    given = {"GLOO_SOCKET_IFNAME": "ib0"}
    assert slurm.gloo_interface("127.0.0.1", given) is None and given == {"GLOO_SOCKET_IFNAME": "ib0"}
    resolved["node7"] = False  # the host name resolves to an address gloo can offer: nothing to do
    assert slurm.gloo_interface("127.0.0.1", environ := {}) is None and environ == {}
    resolved.update(node7=True, **{"127.0.0.1": True})  # a rendezvous on loopback: one host, nothing to do
    assert slurm.gloo_interface("127.0.0.1", environ, run=None) is None and environ == {}


def test_on_the_rendezvous_node_whose_own_name_resolves_to_loopback_gloo_gets_the_route_to_another_node(monkeypatch):
    """Debian's /etc/hosts on the first node of a SLURM job: its own name, the rendezvous address, is 127.0.1.1 there
    (the other nodes resolve it by DNS). The route is to another node of the job, as ``scontrol show hostnames``
    lists them (here ``localhost``, through ``lo``, stands in for it); a job on one node keeps gloo's choice."""
    from fashion_mnist_dp.cli import slurm

    monkeypatch.setattr(slurm.socket, "gethostname", lambda: "node7")
    monkeypatch.setattr(slurm, "_loopback", lambda host: host == "node7")
    environ = {"SLURM_JOB_ID": "3", "SLURM_NODELIST": "node[7-8]"}
    asked = []

    def hostnames(argv, **kwargs):
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout="node7\nlocalhost\n", stderr="")

    assert slurm.gloo_interface("node7", environ, hostnames) == (
        "  gloo interface  : lo (routes to localhost, a node of this job: node7 resolves to loopback here; "
        "GLOO_SOCKET_IFNAME unset, node7 resolves to loopback)")
    assert environ["GLOO_SOCKET_IFNAME"] == "lo" and asked == [["scontrol", "show", "hostnames", "node[7-8]"]]
    one_node = {"SLURM_JOB_ID": "3", "SLURM_NODELIST": "node7"}
    assert slurm.gloo_interface("node7", one_node, scontrol("node7\n")) is None and "GLOO_SOCKET_IFNAME" not in one_node


def test_which_names_resolve_to_loopback_and_which_interface_routes_to_an_address():
    from fashion_mnist_dp.cli.slurm import _loopback, route_interface

    assert [_loopback(name) for name in ("localhost", "127.0.1.1", "::1", "nowhere.invalid")] == [True] * 4
    assert [_loopback(name) for name in ("10.0.0.1", "192.0.2.1")] == [False] * 2
    assert route_interface("127.0.0.1") == route_interface("127.0.0.9") == "lo"
    assert route_interface("::1") is None  # IPv6: not looked up
