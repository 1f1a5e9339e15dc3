"""What a GPU box needs, with fake hardware: TF32 only on compute capability 8.0+, XLA's
libdevice and ptxas found (or the one line with the fix), CUPTI's refusal line, and the
processes holding GPU memory as a fake NVML reports them."""
from __future__ import annotations

import types

import pytest

from app.machine import nvml, profiler_rights, xla_toolchain
from app.machine.hardware import make_gpu, tf32_capable, tf32_state


# ---- TF32 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name,cc,on", [
    ("A100-SXM4-40GB", (8, 0), True), ("NVIDIA GeForce RTX 3090", (8, 6), True),
    ("NVIDIA H100", (9, 0), True), ("Tesla T4", (7, 5), False), ("Tesla V100", (7, 0), False),
    ("Tesla P100", (6, 0), False)])
def test_tf32_is_reported_on_compute_capability_8_and_newer_only(name, cc, on):
    gpus = [make_gpu(name, cc)]
    assert tf32_capable(gpus) is on
    state = tf32_state(gpus, enabled=True)
    assert state["on"] is on and state["gpu_capable"] is on
    assert ("no GPU of compute capability 8.0+" in state["why"]) is (not on)


def test_tf32_off_when_turned_off_or_without_a_gpu():
    assert tf32_state([make_gpu("A100", (8, 0))], enabled=False)["on"] is False
    assert "strict" in tf32_state([make_gpu("A100", (8, 0))], enabled=False)["why"]
    assert tf32_state([], enabled=True) == dict(tf32_state([], enabled=True), on=False)


# ---- XLA's libdevice and ptxas --------------------------------------------------------------

def _find(files, path_ptxas=None, answer="Cuda compilation tools, release 11.8, V11.8.89", **env):
    def version(path):
        v = xla_toolchain.parse_ptxas_version(answer)
        return (v, None) if v else (None, f"`{path} --version` exited 1: {answer}")
    return xla_toolchain.find(env={"PATH": "/usr/bin", **env}, tf_cuda_version="11.2",
                              exists=lambda p: p in files,
                              which=lambda name, path=None: path_ptxas, version=version)


def test_libdevice_and_ptxas_found_where_tensorflow_looks():
    tc = _find({"/usr/local/cuda/nvvm/libdevice/libdevice.10.bc"}, "/usr/local/bin/ptxas")
    assert tc.can_compile and tc.ptxas_version == "11.8"
    assert tc.searched == ("/usr/local/cuda-11.2", "/usr/local/cuda")
    assert xla_toolchain.env_line(tc).startswith("XLA on GPU:    can compile")
    assert xla_toolchain.jit_refusal(tc, [make_gpu("T4", (7, 5))]) is None


def test_xla_flags_data_dir_replaces_the_roots():
    tc = _find({"/opt/nv/nvvm/libdevice/libdevice.10.bc"}, "/opt/nv/bin/ptxas",
               XLA_FLAGS="--xla_gpu_autotune_level=2 --xla_gpu_cuda_data_dir=/opt/nv")
    assert tc.searched == ("/opt/nv",) and tc.libdevice.startswith("/opt/nv/")


def test_missing_libdevice_is_one_line_with_the_fix_on_a_gpu_only():
    tc = _find(set(), None)
    assert not tc.can_compile
    line = xla_toolchain.jit_refusal(tc, [make_gpu("T4", (7, 5))])
    assert "libdevice.10.bc not found" in line and "ptxas not found" in line
    assert "\n" not in line
    assert "nvidia-cuda-nvcc-cu11" in xla_toolchain.env_line(tc)
    assert xla_toolchain.jit_refusal(tc, []) is None       # XLA on a CPU needs neither


def test_jit_without_a_gpu_is_a_note_not_a_refusal():
    note = xla_toolchain.cpu_note(True, [])
    assert note.startswith("--jit without a GPU") and "without --jit" in note
    assert "\n" not in note
    assert xla_toolchain.cpu_note(False, []) is None                    # no --jit
    assert xla_toolchain.cpu_note(True, [make_gpu("T4", (7, 5))]) is None  # XLA's home


def test_a_ptxas_that_does_not_answer_is_named():
    tc = _find({"/usr/local/cuda/nvvm/libdevice/libdevice.10.bc"}, "/usr/local/bin/ptxas",
               answer="cannot execute binary file")
    assert not tc.can_compile
    assert "does not answer --version" in xla_toolchain.problem(tc)


def test_jit_on_a_gpu_without_the_toolchain_stops_train_before_anything(monkeypatch, tmp_path):
    from app.core.errors import UsageError

    monkeypatch.setattr(xla_toolchain, "find", lambda **kw: xla_toolchain.Toolchain(
        None, None, None, "not found", ("/usr/local/cuda",)))
    hw = types.SimpleNamespace(gpus=[make_gpu("Tesla T4", (7, 5))])
    with pytest.raises(UsageError) as err:
        xla_toolchain.check_jit(True, hw.gpus)   # job.prepare's first check after the strategy
    line = err.value.line()
    assert line.startswith("error: --jit cannot compile for the GPU here: libdevice.10.bc not "
                           "found") and "allowed: --jit once libdevice and ptxas" in line
    xla_toolchain.check_jit(False, hw.gpus)     # no --jit: nothing to check


# ---- CUPTI's rights ---------------------------------------------------------------------------

PARAMS_ADMIN = "ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 1\nRmLogonRC: 1\n"
STATUS_USER = "Name:\tpython3\nCapEff:\t0000000000000000\n"
STATUS_ROOT_ADMIN = "Name:\tpython3\nCapEff:\t00000000a82425fb\n"   # docker's default + SYS_ADMIN
STATUS_USER_KEPT = "Name:\tpython3\nCapEff:\t0000000000200000\n"    # TFMP_GPU_PROFILING=1


def test_cupti_refusal_names_the_cause_and_both_fixes():
    line = profiler_rights.refusal(PARAMS_ADMIN, STATUS_USER, has_gpu=True)
    assert line.startswith("warning: the profile will have no GPU kernels")
    assert "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES" in line and "RmProfilingAdminOnly: 1" in line
    assert "NVreg_RestrictProfilingToAdminUsers=0" in line and "--cap-add SYS_ADMIN" in line
    assert "TFMP_GPU_PROFILING=1" in line
    assert "\n" not in line


@pytest.mark.parametrize("params,status,gpu", [
    (PARAMS_ADMIN.replace("AdminOnly: 1", "AdminOnly: 0"), STATUS_USER, True),  # host allows all
    (PARAMS_ADMIN, STATUS_ROOT_ADMIN, True),                                    # CAP_SYS_ADMIN
    (PARAMS_ADMIN, STATUS_USER_KEPT, True),                                     # kept for tf
    (PARAMS_ADMIN, STATUS_USER, False),                                         # no GPU
    (None, STATUS_USER, True),                                                  # no driver file
])
def test_no_cupti_line_where_profiling_is_allowed(params, status, gpu):
    assert profiler_rights.refusal(params, status, gpu) is None


# ---- NVML: who holds GPU memory -------------------------------------------------------------

class FakeNVML(types.SimpleNamespace):
    """The few pynvml calls app.machine.nvml makes, over one fake 16 GiB T4."""

    class NVMLError_LibraryNotFound(Exception):
        pass

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, procs=(), used=0, missing=False):
        super().__init__()
        self.procs, self.used, self.missing, self.shut = procs, used, missing, False

    def nvmlInit(self):
        if self.missing:
            raise self.NVMLError_LibraryNotFound("libnvidia-ml.so.1 not found")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlSystemGetDriverVersion(self):
        return b"470.82.01"

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlDeviceGetName(self, h):
        return b"Tesla T4"

    def nvmlDeviceGetMemoryInfo(self, h):
        total = 16 * 2**30
        return types.SimpleNamespace(total=total, used=self.used, free=total - self.used)

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 64

    def nvmlDeviceGetPowerUsage(self, h):
        return 61_500

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 70_000

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in self.procs]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []

    def nvmlSystemGetProcessName(self, pid):
        raise RuntimeError("not found")


KERNEL = (4242, 14 * 2**30)
COMMANDS = {4242: "/usr/bin/python3 -m ipykernel_launcher -f kernel-1.json"}


def test_processes_holding_memory_are_named_largest_first_without_our_own():
    fake = FakeNVML(procs=[(77, 300 * 2**20), KERNEL, (999, 1 * 2**30)],
                    used=int(15.3 * 2**30) + 2 * 2**30 // 2)
    reading = nvml.read(fake, command=COMMANDS.get)
    assert fake.shut and reading.driver_version == "470.82.01"
    gpu = reading.gpus[0]
    assert (gpu.name, gpu.utilization_percent, gpu.temperature_c, gpu.power_w) == \
        ("Tesla T4", 87, 64, 61.5)
    names = nvml.holders(gpu, own_pids=(999,))
    assert names[0] == ("pid 4242 /usr/bin/python3 -m ipykernel_launcher -f kernel-1.json "
                        "(14.0 GiB)")
    assert names[1] == "pid 77 (not in this container) (300 MiB)"
    assert not any("pid 999" in n for n in names)
    line = nvml.shortage_line(gpu, own_pids=(999,))
    assert "held by pid 4242" in line and "TF_FORCE_GPU_ALLOW_GROWTH=true" in line
    assert nvml.is_short(gpu, own_pids=(999,))


def test_memory_no_listed_process_accounts_for_is_said_to_be_outside_the_container():
    gpu = nvml.read(FakeNVML(procs=[], used=6 * 2**30), command=COMMANDS.get).gpus[0]
    assert nvml.holders(gpu) == ["6.0 GiB held by processes outside this container's view "
                                 "(another container or the host: nvidia-smi there names them)"]


def test_a_card_to_ourselves_is_not_short():
    gpu = nvml.read(FakeNVML(procs=[(999, 2**30)], used=2**30 + 200 * 2**20),
                    command=COMMANDS.get).gpus[0]
    assert not nvml.is_short(gpu, own_pids=(999,)) and nvml.holders(gpu, (999,)) == []


def test_no_gpu_no_driver_no_package_is_a_reason_not_a_failure(monkeypatch):
    assert nvml.read(FakeNVML(missing=True)).error == nvml.NO_DRIVER
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)   # import fails
    reading = nvml.read()
    assert reading.gpus == () and reading.error == nvml.NO_PACKAGE


def test_oom_hint_names_the_holders_only_for_out_of_memory_errors(monkeypatch):
    fake = FakeNVML(procs=[KERNEL], used=15 * 2**30)
    monkeypatch.setattr(nvml, "_command", COMMANDS.get)
    oom = RuntimeError("ResourceExhaustedError: OOM when allocating tensor with shape[256,64]")
    hint = nvml.oom_hint(oom, fake)
    assert hint.startswith("out of GPU memory: ") and "pid 4242" in hint
    assert nvml.oom_hint(ValueError("bad shape"), fake) is None


def test_the_visible_gpu_is_the_first_of_cuda_visible_devices():
    assert nvml.visible_index({"CUDA_VISIBLE_DEVICES": "2,3"}) == 2
    assert nvml.visible_index({}) == 0 and nvml.visible_index({"CUDA_VISIBLE_DEVICES": "GPU-a"}) == 0


def test_tune_auto_budget_is_the_free_memory_and_names_the_holders():
    from app.core.errors import UsageError
    from app.tuner import budget

    usable = 14 * 2**30
    gpu = nvml.read(FakeNVML(procs=[KERNEL], used=14 * 2**30 + 300 * 2**20),
                    command=COMMANDS.get).gpus[0]
    b = budget.resolve("auto", usable, gpu_auto=lambda u: budget.gpu_auto_budget(u, gpu))
    assert b.bytes == gpu.memory_free < usable and "free on GPU 0" in b.source
    idle = nvml.read(FakeNVML(used=300 * 2**20), command=COMMANDS.get).gpus[0]
    assert budget.gpu_auto_budget(usable, idle).bytes == usable
    full = nvml.read(FakeNVML(procs=[KERNEL], used=16 * 2**30 - 10 * 2**20),
                     command=COMMANDS.get).gpus[0]
    with pytest.raises(UsageError) as err:
        budget.gpu_auto_budget(usable, full, nvml.holders(full))
    assert "held by pid 4242" in err.value.line()
    assert budget.resolve("2GiB", usable).bytes == 2 * 2**30     # a size still wins
