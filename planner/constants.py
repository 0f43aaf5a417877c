"""The few measured constants of the estimator, each named and explained.

Everything else in the planner is arithmetic on the model's shapes and on how DeepSpeed, PyTorch
and transformers lay memory out. These constants stand for what arithmetic cannot know: the
driver's footprint, the allocator's fragmentation, and how fast the hardware really runs. They are
calibrated against ``bench/results`` (``bench/accuracy.py`` reports the fit); see docs/planner.md.
"""

from __future__ import annotations

GIB = 1024**3

# --- device memory outside PyTorch's allocator ------------------------------------------------
#: CUDA context + cuBLAS/cuBLASLt workspaces + kernel images of torch on Hopper (torch 2.x, lazy
#: module loading). NVML reports it for the process; torch.cuda.max_memory_reserved() does not.
CUDA_CONTEXT_BYTES = int(0.75 * GIB)
#: NCCL communicator buffers and channels per GPU, only when the job spans more than one GPU.
NCCL_BYTES_PER_GPU = int(0.5 * GIB)

# --- the caching allocator ---------------------------------------------------------------------
#: Reserved minus allocated at the peak, as a fraction of the allocated peak: block rounding and
#: fragmentation of the caching allocator (torch reserves in 2 MiB / 20 MiB segments).
ALLOCATOR_SLACK_FRACTION = 0.06

# --- host memory ---------------------------------------------------------------------------------
#: Resident memory of one training process before any model tensor: Python, torch with its CUDA
#: libraries, transformers, DeepSpeed and its compiled ops.
HOST_PROCESS_BYTES = int(3.0 * GIB)

# --- fitting ---------------------------------------------------------------------------------------
#: A configuration fits a GPU only with this fraction of its memory left free: the estimator's
#: error band plus what other processes (the display, monitoring) hold.
GPU_SAFETY_FRACTION = 0.03
#: Same for host RAM (the OS, page cache the job needs, other users' processes).
HOST_SAFETY_FRACTION = 0.10

# --- speed -----------------------------------------------------------------------------------------
#: Dense bf16 tensor-core rate of an H200 used when the hardware spec gives none (FLOP/s).
DEFAULT_GPU_FLOPS = 790e12
#: Model FLOPs utilisation reached by HF transformers + DeepSpeed on a large matmul-bound step.
MFU = 0.40
#: The smallest matmul dimension (tokens per micro-batch, or the hidden size) at which matmuls reach
#: half of MFU: below it they are bound by memory traffic, not by tensor cores.
MATMUL_HALF_EFFICIENCY_DIM = 256
#: Host-side cost of one decoder layer in one pass (forward, backward or recomputation): kernel
#: launches and Python of HF's layer; overlaps with GPU work, so it only matters when larger.
LAYER_PASS_OVERHEAD_S = 0.6e-3
#: Extra host-side cost of ZeRO-3's fetch/release hooks per decoder layer per pass.
ZERO3_LAYER_PASS_OVERHEAD_S = 1.5e-3
#: Effective host<->GPU copy rate of pinned memory over PCIe Gen5 x16 (bytes/s).
PCIE_BYTES_PER_S = 25e9
#: Effective NVLink collective (bus) bandwidth between the GPUs of one H200 box (bytes/s).
NVLINK_BYTES_PER_S = 300e9
#: DeepSpeedCPUAdam / CPULion parameter updates per second available to one GPU's rank.
CPU_OPTIMIZER_PARAMS_PER_S = 1.0e9
#: Sequential NVMe throughput per GPU for ZeRO-Infinity swaps (bytes/s).
NVME_BYTES_PER_S = 3e9
#: GPU HBM bandwidth reachable by the fused optimizer step (bytes/s).
HBM_BYTES_PER_S = 3.0e12
#: QLoRA: bitsandbytes dequantises every 4-bit weight in each pass; matmul time is multiplied.
QLORA_MATMUL_SLOWDOWN = 1.35
