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
#: Measured: NVML peak minus torch's reserved peak was 1.29 GiB in all 15 one-GPU cases of
#: bench/results/nvidia-h200-x2-2026-11-30.jsonl (H200, driver 580, CUDA 13.0, torch 2.11).
CUDA_CONTEXT_BYTES = int(1.29 * GIB)
#: NCCL communicator buffers and channels per GPU, only when the job spans more than one GPU.
#: Measured: NVML peak minus torch's reserved peak was 1.76 GiB in all four two-GPU records
#: (ZeRO-2 and ZeRO-3, 0.5B-7B), 0.47 GiB above the one-GPU context.
NCCL_BYTES_PER_GPU = int(0.47 * GIB)

# --- the caching allocator ---------------------------------------------------------------------
#: torch's reserved peak minus the allocated peak is modelled as
#:   BYTES + LOGITS_BLOCKS x fp32 logits of one micro-batch + BLOCKS x fp32 bytes of the largest
#:   trainable tensor + (where ZeRO-3 fetches parameters) VOCABULARY_BLOCKS x the embedding's
#:   weight bytes + (full fine-tuning only) GATHERED_BLOCKS x ZeRO-3's gathered parameters
#:   + unreusable ZeRO-1/2 buckets.
#: BYTES is the caching allocator's rounding and the small blocks' pools. The logits term stands
#: for the vocabulary-sized blocks of the loss (bf16 logits, their fp32 upcast, the log-softmax and
#: its gradient, each a different size and freed at a different moment): a LoRA job at 16k tokens
#: per micro-batch over a 152k vocabulary cached 5.2 GiB above its allocated peak, one at 2k tokens
#: 0.9 GiB. The largest-tensor term stands for the gradient-sized blocks of the embedding/LM head
#: (its .grad, the tied accumulation, the bucket copy, the step's flat and fp32 copies), each
#: allocated at a different moment of the step and too large for any other request to reuse; it
#: vanishes for LoRA, and has a constant of its own with the optimizer offloaded, whose step's
#: copies live on the host. The two fetch terms are there only where ZeRO-3 fetches parameters into
#: fresh buffers (several GPUs, or parameter offload), one per method. Under LoRA every decoder
#: layer's gathered weights have the same shapes, so their buffers reuse each other's blocks; the
#: embedding's and the LM head's do not: an allocator trace of Llama 3.1 8B LoRA with parameter
#: offload on two H200s (``bench/measure.py --alloc-trace none``, bench/results/alloc-trace/)
#: holds five segments of its embedding's size (0.98 GiB) against Mistral 7B's 0.25 GiB ones, and
#: the records of the two cache 5.7 and 1.5 GiB above their allocated peaks. Under full
#: fine-tuning the all-gather outputs interleave with the gradients' reduce-scatter and leave
#: blocks of their own (a two-GPU ZeRO-3 trace shows them as segments of their own, absent on one
#: GPU without offload), and the gradients' large requests reuse the embedding-sized ones: full
#: fine-tuning of 7-9B models on two GPUs cached 6.6-9.7 GiB above the allocated peak with
#: 128k-256k vocabularies, 7.6-7.7 GiB with 32k ones, so its term is in the gathered parameters. The
#: ZeRO-1/2 reduce buckets are structural, not fitted, and so is what ZeRO-1/2 initialisation
#: leaves reserved (memory.py's ``_initialization``), a floor under the peak that the slack does
#: not add to. The six are fitted on the 119 records of the first twenty files of
#: CALIBRATION_RESULTS (below) by the smallest median NVML
#: error with a steep penalty below -2.5%; bench/accuracy.py reports in-sample, leave-one-out and
#: leave-one-file-out errors. These
#: blocks are needed, not idle: held to its allocated peak plus a fifth of this slack, PyTorch's
#: allocator ran out of memory in 6 of 7 configurations (bench/results/memory-limit/).
ALLOCATOR_SLACK_BYTES = int(1.295 * GIB)
ALLOCATOR_LOGITS_BLOCKS = 0.353
ALLOCATOR_LARGEST_GRADIENT_BLOCKS = 4.98
ALLOCATOR_LARGEST_GRADIENT_BLOCKS_OFFLOADED = 4.58
ALLOCATOR_GATHERED_BLOCKS = 1.17
ALLOCATOR_VOCABULARY_BLOCKS = 4.25
#: The same on one GPU with the parameters offloaded: each fetch there is a copy into a block of
#: the parameter's own size, which the next fetch of that size reuses, so the cache holds one
#: vocabulary-sized block at the peak, not the all-gather's several. A count, not fitted; the
#: measurement behind it is in bench/results/field-cases/ (the field report's 7B LoRA).
ALLOCATOR_VOCABULARY_BLOCKS_ONE_GPU = 1.0
#: Soft-capped logits (Gemma 2's ``final_logit_softcapping``) leave one more fp32 logits-sized
#: block in the cache when no gradient checkpointing frees the activations between the loss and
#: the next step: a count, not fitted. Measured (``bench/measure.py --matrix logits`` and
#: ``heldout17``): Gemma 2 2B LoRA without checkpointing at 4096 tokens a micro-batch cached
#: 6.3 GiB above its allocated peak under ZeRO-0, ZeRO-2 (one GPU, two, optimizer offload) and at
#: sequence 4096, the same config with the soft-capping switched off 2.4 GiB: the difference is one
#: 3.9 GiB fp32 logits block. At 2048-3072 tokens 0.65-0.85 of a block more than the slack without
#: it (Gemma 2 9B at ZeRO-0 and -2 alike), at 1024 tokens none. Under ZeRO-3 Gemma 2 2B cached
#: none (one and two GPUs, 4096 tokens: +0.1% and +6.0% without the block, +9.6% and +15.0% with
#: it), Gemma 2 9B at 2048 tokens a whole one (-3.7% without it): the planner counts the block at
#: every stage rather than risk the under-estimate. Llama 3.2 1B and Qwen2.5-1.5B, whose logits
#: are as large and not soft-capped, cached no such block, nor did the soft-capped model with
#: gradient checkpointing, except where the first step's optimizer moments take a block of the loss
#: (``ALLOCATOR_MOMENTS_BLOCKS``, below): Gemma 2 9B LoRA under ZeRO-1 with checkpointing at
#: 2 x 1024 tokens cached 1.57 fp32 logits blocks above its allocated peak where Gemma 2 2B at the
#: same shape cached 0.64. Its allocator trace (bench/results/alloc-trace/) shows why: FusedAdam
#: creates the two 68 MiB moments of the flat partition at the first step, when the largest cached
#: blocks besides the loss's are the layers' 56 MiB MLP intermediates; one moment goes into a
#: freed 1000 MiB logits block, and from the second step on the loss needs a fourth 2000 MiB block.
#: Gemma 2 2B's 24 MiB moments fit in its 36 MiB intermediates' blocks.
ALLOCATOR_SOFTCAP_BLOCKS = 1.0
#: The loss's one more fp32 logits block where the first optimizer step's moments take a block of
#: it (memory.py's ``_moments_take_a_loss_block``), soft-capped or not: a count, not fitted. A
#: soft-capped loss loses a block to moments in any of its blocks (above). Without soft-capping,
#: Qwen2.5-0.5B full fine-tuning under ZeRO-1 at 2 x 4096 tokens (heldout28) cached 1.62 fp32
#: logits blocks above its allocated peak, 7.2% over its plan; its trace shows the first step's
#: two 1.84 GiB moments in the 2.32 GiB bf16 logits block and in one of the three 4.64 GiB fp32
#: ones, and a fourth fp32 segment from the second step on, where the same run under ZeRO-0
#: (moments made at initialisation) kept three. Qwen3 4B LoRA on every projection under ZeRO-1
#: (two 126 MiB moments, both in the 1188 MiB bf16 block) made none, nor did Llama 3.1 8B, Qwen2.5
#: 1.5B and a Gemma 2 2B without soft-capping whose moments fit together in that block
#: (0.63-0.84 blocks cached). ZeRO-3 makes its moments at the first step as well: Gemma 2 9B LoRA
#: at 2048 tokens (68 MiB moments, 56 MiB intermediates) cached 1.54 blocks, at 4096 (112 MiB
#: intermediates) 0.57.
ALLOCATOR_MOMENTS_BLOCKS = 1.0
#: Reserved minus allocated under ZeRO-2 with gradient accumulation and the optimizer on the GPU:
#: one more block of a rank's bf16 gradient partition (the partition the micro-steps before the
#: boundary accumulate into; the boundary's fp32 step cannot reuse its block). A count, not
#: fitted: on one GPU, with everything else the same, Gemma 2 2B cached 9.91 GiB with two
#: micro-steps against 5.01 with one (+4.90; its bf16 gradients are 4.87 GiB) and Phi-3 mini 14.22
#: against 7.07 (+7.15; 7.11 GiB), while the allocated peaks were the same to the byte.
ALLOCATOR_ACCUMULATION_BLOCKS = 1.0
#: The evaluation process (eval loss, then generation; no DeepSpeed): reserved minus allocated, a
#: share of the allocated peak and a fixed part, and NVML minus reserved (its CUDA context, without
#: DeepSpeed's or NCCL's). Six evaluations on an H200 (bench/eval_memory.py,
#: bench/results/eval-memory/): reserved minus allocated 0.12 GiB (Qwen2.5-0.5B, one row) and
#: 1.23-1.83 GiB (7-20% of 7.2-19.4 GiB allocated) for the five larger ones, which this bounds from
#: above; NVML minus reserved 0.67-0.72 GiB. Read off those six, not held out.
EVAL_ALLOCATOR_SLACK_FRACTION = 0.10
EVAL_ALLOCATOR_SLACK_BYTES = int(0.75 * GIB)
EVAL_CUDA_CONTEXT_BYTES = int(0.70 * GIB)
#: Positions of an eval batch whose logits the evaluation process upcasts to fp32 at once for the
#: loss (worker/evaluate.py): the whole batch's would take 4 bytes a position and vocabulary entry,
#: and as much again for their log-softmax.
EVAL_LOSS_CHUNK_POSITIONS = 256

# --- host memory ---------------------------------------------------------------------------------
#: Resident memory of one training process besides its model tensors: Python, torch with its CUDA
#: libraries (loaded by the first steps), transformers, DeepSpeed. Measured: 2.03-2.23 GiB per rank
#: after the warm-up steps in all 15 records without offload that carry per-phase host figures
#: (one and two GPUs, 0.5B-8B).
HOST_PROCESS_BYTES = int(2.15 * GIB)
#: The same process at deepspeed.initialize, before its first step has loaded the rest of the CUDA
#: libraries: where ZeRO-3 stages its parameter partitions through the host, the peak is this plus
#: the staging copy. Measured as peak RSS less the staging copy, per rank, in the 33 records of full
#: fine-tuning under ZeRO-3 without offload: 1.46-1.61 GiB, median 1.47.
HOST_INIT_PROCESS_BYTES = int(1.5 * GIB)
#: With ZeRO-3's parameters offloaded to the CPU, each rank holds more besides the pinned
#: partitions the planner counts (each rounded up to a power of two by torch's pinned-memory cache,
#: a tied LM head's own block included) and the flat buffer: DeepSpeed's parameter bookkeeping,
#: -0.10 to +0.21 GiB per rank in the 15 calibration records with parameter offload, median 0.10. With the
#: optimizer alone on the CPU the records show no such term (median -0.09 GiB per rank over nine
#: records, once the step's bf16 sub-group copy is counted).
HOST_PARAM_OFFLOAD_BYTES = int(0.1 * GIB)
#: Weight-file size assumed when the checkpoint's files are not at hand (a plan from model.name or
#: model.config): the hub's sharding convention of 5 GB files.
CHECKPOINT_SHARD_BYTES = 5_000_000_000

# --- fitting ---------------------------------------------------------------------------------------
#: A configuration fits a GPU only with this fraction of its memory left free: the estimator's
#: error band plus what other processes (the display, monitoring) hold.
GPU_SAFETY_FRACTION = 0.03
#: Same for host RAM (the OS, page cache the job needs, other users' processes).
HOST_SAFETY_FRACTION = 0.10

# --- speed -----------------------------------------------------------------------------------------
#: Dense bf16 tensor-core rate of an H200 used when the hardware spec gives none (FLOP/s).
DEFAULT_GPU_FLOPS = 790e12
#: The twelve step-time constants below were fitted together on the 139 step times of the
#: calibration files (CALIBRATION_RESULTS; Nelder-Mead on the squared log error of each step and,
#: where a record timed them apart, of its forward-and-backward and its optimizer step;
#: bench/accuracy.py refits them and reports leave-one-out and leave-one-file-out errors). A
#: micro-step is the power mean of its GPU and host clocks (``CLOCK_OVERLAP``): see planner/speed.py.
#: The host the host-clock constants below describe: the time of one small module call through
#: two Python hooks on the training device (bench/measure.py's host probe, ``hooked_module_us``).
#: The probe read 15.8-32.7 us on the same kind of H200 box in six device sessions, whose step
#: times moved with it; a plan scales its host clock by this box's reading over this
#: (``hardware.host_clock_factor``) to the power ``HOST_CLOCK_EXPONENT``. Fitted with the
#: constants below; the records without a probe count as taken on this host.
HOST_HOOK_REFERENCE_US = 20.6
#: How far a probe's reading moves the host clock: the factor is (probe / reference) to this power.
#: One probe is a noisy figure of the host's speed: eight probes in a row on an idle H200 box
#: (bench/results/hostclock-nvidia-h200-x2-2026-12-01.json) read 15.5-22.4 us, each in its own
#: process, and one configuration's steps moved less than its cases' probes did. Fitted with the
#: constants below (1 would take the probe at its word, 0 ignore it).
HOST_CLOCK_EXPONENT = 0.590
#: The host-clock factors a plan accepts (hardware.host_clock_factor) and a probe may yield.
HOST_CLOCK_FACTOR_BOUNDS = (0.05, 50.0)
#: Model FLOPs utilisation of the matmuls (the GPU clock: FLOPs / (rate x MFU)).
MFU = 0.744
#: The smallest matmul dimension at which matmuls reach half of MFU. 0: on the H200 data a
#: size-dependent efficiency was not separable from the host clock, which bounds small shapes.
MATMUL_HALF_EFFICIENCY_DIM = 0
#: Host clock: one operation a decoder layer dispatches (planner/ops.py counts them: a Llama layer
#: 38 forward, 71 backward): its Python, autograd's bookkeeping, the kernel launch. It overlaps the
#: GPU's work, so it sets the pace of small models only (a 7B LoRA step is FLOP-bound).
LAYER_OP_SECONDS = 2.493e-5
#: Host clock: ZeRO-3's fetch/release hooks per pass, for a module whose parameters are gathered
#: (above ``stage3_param_persistence_threshold``) and for any other module a layer runs (the layer,
#: attention, MLP, activation, norms, peft's wrapper, dropout and small adapters:
#: planner/ops.py's ``layer_modules``), which costs only the hook's Python.
ZERO3_FETCH_PASS_OVERHEAD_S = 0.558e-3
ZERO3_HOOK_PASS_OVERHEAD_S = 0.322e-3
#: Host clock, ZeRO-3 over several GPUs: the latency of each gathered module's all-gather beyond
#: its bytes (the NVLink term).
ZERO3_COLLECTIVE_PASS_OVERHEAD_S = 0.144e-3
#: GPU optimizer step per parameter a GPU updates (DeepSpeed's bf16 optimizer: fp32 master,
#: gradient clipping, the fused AdamW, the copy back to bf16).
GPU_OPTIMIZER_SECONDS_PER_PARAM = 16.2e-12
#: Optimizer offload: host CPU seconds per parameter updated, summed over the ranks, which share
#: the host's cores (the DeepSpeedCPUAdam update and DeepSpeed's bookkeeping; the PCIe terms come
#: on top). ZeRO-3 with the parameters on the GPU costs more: after each sub-group's update it
#: copies the fp32 partition into the GPU's bf16 one (``_reassign_or_swap_out_partitioned_parameters``),
#: a cast through pageable memory that waits for the copy. With the parameters on the host too that
#: copy stays on the host, and the step runs at ZeRO-1/2's rate (Llama 3.2 1B, full, on one H200:
#: optimizer step 0.358 s measured, 0.64 s at the ZeRO-3 rate, 0.38 s at ZeRO-1/2's).
CPU_OPTIMIZER_SECONDS_PER_PARAM_ZERO3 = 0.509e-9
CPU_OPTIMIZER_SECONDS_PER_PARAM_ZERO12 = 0.2817e-9
#: How the GPU and host clocks of a micro-step combine, and with them the collectives and offload
#: traffic ``overlap_comm`` runs beside the compute: their power mean (sum of t^(1/q))^q, the
#: longest as q -> 0, their sum at q = 1 (planner/speed.py). Where the two clocks are close the
#: step took longer than either: Gemma 2 2B, Llama 3.2 1B and Qwen2.5-1.5B LoRA at ZeRO-0, whose
#: two clocks were planned within 5% of each other, ran 1.4-2.1x the larger; Qwen2.5-7B LoRA with
#: parameter offload on two GPUs spent 2.17 s in forward and backward against its 1.45 s host clock
#: and 0.92 s of parameter traffic.
CLOCK_OVERLAP = 0.757
#: The same under ZeRO-1/2 with ``overlap_comm``, whose engine synchronises the host with the GPU in
#: every backward (stage_1_and_2's ``independent_gradient_partition_epilogue`` and each bucket's
#: reduction call ``synchronize()``), so the host cannot queue the next work ahead and the clocks
#: add more: profiled through DeepSpeed's engine (bench/results/profile/
#: nvidia-h200-2026-12-01-deepspeed-lora.jsonl), Gemma 2 9B LoRA at 2 x 1024 tokens took 0.60 s a
#: step at ZeRO-0 and 0.77 and 0.70 s at ZeRO-1 and -2 with the same GPU kernel time (0.32 s).
#: Fitted with the others; the held-out files' ZeRO-1/2 LoRA steps had been planned 9-15% short.
CLOCK_OVERLAP_ZERO12 = 0.818
#: The optimizer step's host cost per trainable tensor (scaled by the host clock): DeepSpeed's
#: walk over the parameters (gradient norms for clipping, overflow checks, the copies back to the
#: model). Timed phase by phase (``measured.phase_seconds``), LoRA's optimizer step took 0.03-0.06 s
#: on one GPU for 208-288 adapter tensors of a few million parameters, 0.09-0.16 s under ZeRO-3 on
#: two GPUs, where the per-parameter terms count almost nothing. Fitted with the other step-time
#: constants (0.047 s for 208 tensors on the reference host).
OPTIMIZER_STEP_TENSOR_SECONDS = 2.37e-4
#: Effective host<->GPU rate of DeepSpeed's offload copies over PCIe Gen5 x16 (bytes/s). One 1 GiB
#: pinned copy moves 55 GB/s each way on the H200 box, both GPUs at once too, a pageable one 18-23
#: (bench/pcie.py; bench/results/pcie-nvidia-h200-x2-2026-12-01.json); DeepSpeed copies parameter
#: by parameter, some through pageable buffers. With 55 GB/s the step-time fit turns the clocks'
#: power mean into nearly their sum and fits the records less well (164 of 198 within ±25%
#: against 169): the offload records did not see the peak rate.
PCIE_BYTES_PER_S = 25e9
#: Effective NVLink collective (bus) bandwidth between the GPUs of one H200 box (bytes/s).
NVLINK_BYTES_PER_S = 300e9
#: Sequential NVMe throughput per GPU for ZeRO-Infinity swaps (bytes/s).
NVME_BYTES_PER_S = 3e9
#: QLoRA: bitsandbytes dequantises every 4-bit weight in each pass; matmul time is multiplied.
QLORA_MATMUL_SLOWDOWN = 1.35

# --- provenance ----------------------------------------------------------------------------------
#: Measurement files (bench/results) the constants above were fitted on. bench/accuracy.py reports
#: every other record as held-out: it checks the model, it was not used to build it.
CALIBRATION_RESULTS = (
    "nvidia-h200-x2-2026-11-30.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-2.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-3.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-4.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-5.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-6.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-7.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-8.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-9.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-10a.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-10b.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-11a.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-11b.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-12.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-13a.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-13b.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-13c.jsonl",
    "nvidia-h200-x2-2026-11-30-repeat-a.jsonl",
    "nvidia-h200-x2-2026-11-30-repeat-b.jsonl",
    # the soft-capped loss block (a count, where it applies): not the six slack constants
    "nvidia-h200-x2-2026-11-30-logits.jsonl",
    "nvidia-h200-x2-2026-11-30-heldout-17.jsonl",
)
