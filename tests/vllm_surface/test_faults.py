"""Why an engine died, read from its log (vllm_surface/faults.py), on lines two dead vLLM 0.11.0
engines wrote on an H200 (async scheduling, docs/evidence/2026-12-03-h200-real-bugs)."""

from __future__ import annotations

from cascade_repro.vllm_surface import faults

SCATTER = (
    "/pytorch/aten/src/ATen/native/cuda/ScatterGatherKernel.cu:163: operator(): block: [0,0,0], thread: [0,0,0] "
    'Assertion `idx_dim >= 0 && idx_dim < index_size && "scatter gather kernel index out of bounds"` failed.'
)
GATHER = (
    "/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: block: [19,0,0], "
    'thread: [64,0,0] Assertion `ind >=0 && ind < ind_dim_size && "vectorized gather kernel index out of bounds"` failed.'
)
DEAD = (
    "(EngineCore_DP0 pid=5328) ERROR 12-04 04:13:16 [core.py:710] RuntimeError: Worker failed with error "
    "'CUDA error: device-side assert triggered"
)


def test_the_first_assertion_names_the_fault_by_file_line_and_condition():
    log = "INFO loading\n" + GATHER + "\n" + GATHER.replace("[64,0,0]", "[65,0,0]") + "\n" + DEAD + "\n"
    got = faults.cause_from_log(log)
    assert got == faults.Fault(
        faults.KERNEL,
        'device-side assertion IndexKernelUtils.cu:16 `ind >=0 && ind < ind_dim_size && "vectorized gather '
        'kernel index out of bounds"`',
    )
    assert faults.cause_from_log(SCATTER).detail.startswith("device-side assertion ScatterGatherKernel.cu:163 `idx_dim")


def test_without_an_assertion_line_cuda_s_own_words_name_the_kernel_fault():
    assert faults.cause_from_log(DEAD) == faults.Fault(faults.KERNEL, "device-side assert triggered")
    got = faults.cause_from_log("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert got == faults.Fault(faults.KERNEL, "an illegal memory access was encountered")


def test_running_out_of_memory_anywhere_is_not_a_kernel_fault():
    log = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n" + GATHER
    assert faults.cause_from_log(log) == faults.Fault(faults.MEMORY, "")
    assert faults.cause_from_log("INFO all good\nEngineDeadError: EngineCore encountered an issue.") is None


def test_the_cause_travels_in_the_reason_and_only_a_kernel_fault_reads_back():
    dead = "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."
    kernel = faults.with_cause(dead, faults.cause_from_log(SCATTER))
    assert kernel.startswith(dead + "; engine log: kernel fault: device-side assertion ScatterGatherKernel.cu:163")
    assert faults.kernel_fault(kernel).startswith("device-side assertion ScatterGatherKernel.cu:163 `idx_dim")
    assert faults.kernel_fault(faults.with_cause(dead, faults.Fault(faults.MEMORY, ""))) == ""
    assert faults.with_cause(dead, None) == dead
    assert faults.kernel_fault(dead) == faults.kernel_fault("") == faults.kernel_fault(None) == ""


def test_a_log_is_read_from_its_end_and_never_through_a_link(tmp_path):
    log = tmp_path / "worker-k.log"
    log.write_text("x" * (faults.TAIL_BYTES + 10) + "\n" + GATHER + "\n")
    assert faults.cause_from_file(log).kind == faults.KERNEL
    link = tmp_path / "worker-l.log"
    link.symlink_to(log)
    assert faults.cause_from_file(link) is None
    assert faults.cause_from_file(tmp_path / "missing.log") is None


def test_only_the_lines_after_start_are_read(tmp_path):
    # An earlier attempt's fault, appended to the same log, is not this attempt's cause.
    log = tmp_path / "worker-k.log"
    log.write_text(GATHER + "\n")
    start = faults.log_size(log)
    assert faults.cause_from_file(log, start) is None
    with log.open("a") as f:
        f.write("torch.OutOfMemoryError: CUDA out of memory.\n")
    assert faults.cause_from_file(log, start) == faults.Fault(faults.MEMORY, "")
    assert faults.log_size(tmp_path / "missing.log") == 0
