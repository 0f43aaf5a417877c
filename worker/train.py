"""The training process: ``python -m worker.train --job-dir DIR`` (one process per GPU).

Run by the worker's launcher or the ``deepspeed`` launcher; the rank comes from ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. It reads ``DIR/run.json``
(see ``worker/_trainlib/runfile.py``), trains with DeepSpeed, and writes:

- ``DIR/progress.jsonl`` (rank 0, one flushed JSON object per line, each with ``type`` and ``time``):
  ``start`` {total_steps, start_step, resumed_from, pid, world_size, train_rows, eval_rows,
  trainable_params, gpu_memory_limit_bytes (what PyTorch's allocator is held to per GPU; null where
  nothing is limited), packed_rows, data (rows, tokens per row, truncated and dropped rows, tokens,
  trained tokens: see ``worker/_trainlib/data.py``'s ``encode_report``), attn_implementation (the
  attention the model runs)}; ``progress`` every optimizer
  step {step, total_steps, epoch, loss, lr, tokens_per_second (real tokens, never padding),
  samples_per_second, peak_gpu_bytes (PyTorch's reserved peak), peak_allocated_gpu_bytes,
  nvml_peak_bytes (when NVML sees this pid), host_rss_bytes, host_cpu_percent, eta_seconds};
  ``checkpoint`` {step, path}; ``done``
  {step, final_path, peak_gpu_bytes, host_peak_rss_bytes}; ``stopped`` {step, signal} on SIGTERM;
  ``paused`` {step, total_steps} once it saved ``checkpoints/step-N`` because ``DIR/pause.request``
  exists (the worker's pause).
  GPU byte figures are null on the CPU.
- ``DIR/eval_split.jsonl``: the held-out rows, ``{"format", "messages"}`` per line, for
  ``worker.evaluate``.
- ``DIR/checkpoints/step-N/`` (see ``worker/_trainlib/checkpoint.py``), complete or absent.
  A rerun resumes from the newest one, continuing the step count and the data order.
- ``DIR/failure.json`` {kind, reason, message} on failure.

Exit codes: 0 done; 1 error (system fault); 2 user_error (bad_dataset, rows_dropped, bad_model,
missing_tokenizer, qlora_unavailable, optimizer_unavailable, attn_unavailable, bad_lora_targets);
3 cuda_oom; 4 host_oom; 5 disk_full; 6 paused (a checkpoint of the last step is complete);
143 stopped by SIGTERM (no failure.json; a checkpoint being written is discarded, never left half).
"""

from __future__ import annotations

import argparse
import copy
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunebox.datasets import check_dropped_share
from worker._trainlib import checkpoint as ckpt
from worker._trainlib.data import (
    IGNORE,
    Example,
    MicroBatchOrder,
    Packed,
    collate,
    collate_packed,
    encode_report,
    pack,
    pad_id,
    split_rows,
    total_steps,
    write_eval_split,
)
from worker._trainlib.progress import Meter, ProgressLog, host_peak_rss_bytes
from worker._trainlib.runfile import (
    EXIT_OK,
    EXIT_PAUSED,
    EXIT_TERMINATED,
    PAUSE_FILE,
    USER_ERROR,
    JobFailure,
    RunConfig,
    Terminated,
    classify,
    load_run,
    write_failure,
)
from worker._trainlib.schedule import lr_factor, warmup_steps


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def _quiet_known_warnings() -> None:
    import warnings

    # emitted once per collective by DeepSpeed's calls and once per step by transformers 5.x; they
    # drown the log the worker keeps for users without saying anything about their job
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    warnings.filterwarnings("ignore", message=r".*(gradient|activation)_checkpointing.*deprecated",
                            category=FutureWarning)


def _prepare_environment(run: RunConfig) -> None:
    _quiet_known_warnings()
    if run.device == "cpu":
        # without it DeepSpeed probes for CUDA and prints a warning on stdout
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def deepspeed_config(run: RunConfig, world_size: int) -> dict[str, Any]:
    """The plan's DeepSpeed config, with batch sizes made consistent with the ranks really running."""
    cfg = copy.deepcopy(run.deepspeed_config)
    cfg.setdefault("train_micro_batch_size_per_gpu", run.resolved.micro_batch_size)
    cfg.setdefault("gradient_accumulation_steps", run.resolved.gradient_accumulation_steps)
    cfg["train_batch_size"] = (cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]
                               * world_size)
    cfg.setdefault("steps_per_print", 2**31 - 1)
    if "bf16" not in cfg and "fp16" not in cfg and run.resolved.precision != "fp32":
        cfg[run.resolved.precision] = {"enabled": True}
    training = run.spec.training
    declared = {"adamw": "AdamW", "lion": "Lion", "sgd": "SGD"}.get(training.optimizer.value)
    if "optimizer" not in cfg and declared is not None:
        cfg["optimizer"] = {"type": declared, "params": {"lr": training.learning_rate,
                                                         "weight_decay": training.weight_decay}}
    return cfg


def _fused_lion(cfg: dict[str, Any]) -> bool:
    """Whether DeepSpeed would build the config's optimizer as FusedLion (Lion, not offloaded)."""
    offload = (cfg.get("zero_optimization") or {}).get("offload_optimizer") or {}
    declared = str((cfg.get("optimizer") or {}).get("type", "")).lower()
    return declared == "lion" and offload.get("device", "none") not in ("cpu", "nvme")


class Trainer:
    def __init__(self, run: RunConfig):
        self.run = run
        self.spec = run.spec
        self.rank = _env_int("RANK", 0)
        self.world = _env_int("WORLD_SIZE", 1)
        self.is_rank0 = self.rank == 0
        self.lora = self.spec.method.value in ("lora", "qlora")
        self.progress = ProgressLog(run.progress_path, self.is_rank0)
        self.meter = Meter(cuda=run.device == "cuda")
        self.step = 0
        self.gpu_memory_limit_bytes: int | None = None
        #: called with "forward", "backward" and "step" as each phase of a micro-step has been issued
        #: (bench/measure.py measures and times the phases of the trainer's own steps through it)
        self.on_phase: Callable[[str], None] | None = None

    # ---------------------------------------------------------------- preparation

    def preflight(self) -> None:
        from worker._trainlib import modeling

        if self.run.device == "cuda":
            modeling.check_gpus(os.environ.get("TUNEBOX_EXPECTED_GPU_UUIDS"))
        if self.spec.method.value == "qlora":
            modeling.check_qlora(self.run.device)
        client_optimizer = "optimizer" not in self.run.deepspeed_config
        if self.spec.training.optimizer.value == "adamw_8bit" and client_optimizer:
            modeling.check_8bit_optimizer(self.run.device)
        modeling.attention_kwargs(self.run.resolved.attn_implementation)
        modeling.check_model_folder(self.run.model_dir)
        if self.is_rank0:
            ckpt.remove_partials(self.run.checkpoints_dir)

    def load_data(self) -> None:
        from tunebox.datasets import DatasetError, load_records
        from worker._trainlib.modeling import load_tokenizer

        self.tokenizer = load_tokenizer(self.run.model_dir)
        declared = self.spec.dataset.format.value if self.spec.dataset else "auto"
        entry = self.spec.dataset.name if self.spec.dataset else None
        try:
            fmt, rows = load_records(self.run.dataset_file, declared, entry)
        except DatasetError as exc:
            raise JobFailure(USER_ERROR, "bad_dataset", str(exc)) from exc
        fraction = self.spec.dataset.eval_fraction if self.spec.dataset else 0.0
        train_rows, eval_rows = split_rows(rows, fraction, self.spec.training.seed)
        eval_format = fmt
        if self.spec.eval.dataset is not None:
            eval_format, eval_rows = self._eval_dataset_rows()
        if self.is_rank0:
            write_eval_split(self.run.eval_split_path, eval_rows, eval_format)
        self.examples: list[Example]
        self.examples, self.data_report = encode_report(self.tokenizer, train_rows, fmt,
                                                        self.spec.training.seq_len)
        self.eval_rows = len(eval_rows)
        self.data_report["eval_rows"] = self.eval_rows
        limit = self.spec.dataset.max_dropped_fraction if self.spec.dataset else 0.01
        too_many = check_dropped_share(self.data_report, limit)
        if too_many and self.examples:
            raise JobFailure(USER_ERROR, "rows_dropped", too_many, data=self._dropped_rows_data())
        if not self.examples:
            raise JobFailure(USER_ERROR, "bad_dataset", "no training row has an answer token within seq_len "
                             f"{self.spec.training.seq_len} (prompts too long, or every row held out)")
        # packed: the rows of the data order are packed rows of whole examples, fixed for the run
        self.packed: list[Packed] | None = (pack(self.examples, self.spec.training.seq_len)
                                            if self.spec.training.packing else None)

    def _dropped_rows_data(self) -> dict[str, Any]:
        """The data report and the keys of its dataset and tokenizer (``tunebox/data_keys.py``): the
        worker keeps it, so the same job submitted again is refused before it is queued."""
        from tunebox.data_keys import report_keys

        data: dict[str, Any] = {"report": self.data_report}
        keys = report_keys(self.run.dataset_file, self.run.model_dir)
        if keys is not None and self.spec.dataset is not None:
            data.update(dataset_key=keys[0], model_key=keys[1], format=self.spec.dataset.format.value,
                        name=self.spec.dataset.name)
        return data

    def _eval_dataset_rows(self) -> tuple[Any, list[Any]]:
        """The format and every row of ``eval.dataset`` (the evaluator renders each row by its format)."""
        from tunebox.datasets import DatasetError, load_records

        source = self.spec.eval.dataset
        assert source is not None
        if self.run.eval_dataset_path is None:
            raise JobFailure(USER_ERROR, "bad_dataset", "eval.dataset: training needs its path or id")
        try:
            fmt, rows = load_records(self.run.eval_dataset_path, source.format.value, source.name)
        except DatasetError as exc:
            raise JobFailure(USER_ERROR, "bad_dataset", f"eval.dataset: {exc}") from exc
        return fmt, list(rows)

    def build_engine(self) -> None:
        from worker._trainlib.extlocks import start_sweeper

        # DeepSpeed builds or loads its ops while it sets up: a build lock left by a killed run
        # would make it wait forever
        sweeper = start_sweeper(on_build=self._op_build)
        try:
            self._build_engine()
        finally:
            sweeper.set()

    def _op_build(self, op: str, by_this_process: bool) -> None:
        self.progress.emit("op_build", op=op, waiting=not by_this_process)

    def _build_engine(self) -> None:
        import deepspeed
        import torch

        if self.run.device == "cuda":
            # before anything touches CUDA: zero.Init and the allocator figures use the current device,
            # and without this every rank would build its shard on GPU 0
            torch.cuda.set_device(_env_int("LOCAL_RANK", 0))
            from worker._trainlib.modeling import limit_gpu_memory

            if limit_gpu_memory(self.run.gpu_memory_limit_bytes, _env_int("LOCAL_RANK", 0)) is not None:
                self.gpu_memory_limit_bytes = self.run.gpu_memory_limit_bytes
        deepspeed.init_distributed(dist_backend=None, verbose=False)
        self.world = deepspeed.comm.get_world_size()
        self.rank = deepspeed.comm.get_rank()
        self.is_rank0 = self.rank == 0
        torch.manual_seed(self.spec.training.seed)
        self.ds_config = deepspeed_config(self.run, self.world)
        model = self._load_model()
        trainable = [p for p in model.parameters() if p.requires_grad]
        if not trainable:
            raise JobFailure(USER_ERROR, "bad_lora_targets", "nothing to train: no parameter requires grad")
        self.trainable_params = sum(int(getattr(p, "ds_numel", p.numel())) for p in trainable)
        optimizer = None
        if "optimizer" not in self.ds_config:
            from worker._trainlib.modeling import build_optimizer

            t = self.spec.training
            optimizer = build_optimizer(t.optimizer.value, trainable, t.learning_rate, t.weight_decay,
                                        self.run.device)
        elif self.run.device == "cpu" and _fused_lion(self.ds_config):
            from deepspeed.ops.lion import DeepSpeedCPULion

            # DeepSpeed builds a declared Lion as FusedLion, a CUDA kernel, unless the optimizer is
            # offloaded; on the CPU its CPU kernel is the same update
            params = dict(self.ds_config.pop("optimizer").get("params") or {})
            optimizer = DeepSpeedCPULion(trainable, **params)
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable, optimizer=optimizer,
                                               config=self.ds_config)
        # from_pretrained returns the model in eval mode, where transformers skips gradient
        # checkpointing and dropout is off: train in train mode
        self.engine.train()
        groups = self.engine.optimizer.param_groups
        self.peak_lrs = [float(g["lr"]) for g in groups]
        self.manual_schedule = "scheduler" not in self.ds_config

    def _load_model(self) -> Any:
        from worker._trainlib import modeling

        dtype = modeling.torch_dtype(self.run.resolved.precision, self.run.device)
        extra: dict[str, Any] = modeling.attention_kwargs(self.run.resolved.attn_implementation)
        zero3 = int(self.ds_config.get("zero_optimization", {}).get("stage", 0)) == 3
        if zero3:
            from transformers.integrations.deepspeed import HfDeepSpeedConfig

            # kept alive on self: while it exists from_pretrained builds the model under zero.Init,
            # partitioned at construction, so no GPU ever holds the full model
            self._hf_ds_config = HfDeepSpeedConfig(self.ds_config)  # type: ignore[no-untyped-call]
        if self.spec.method.value == "qlora":
            extra.update(modeling.qlora_kwargs(dtype))
        model = modeling.load_causal_lm(self.run.model_dir, dtype, **extra)
        model.config.use_cache = False
        self.attn_implementation = getattr(model.config, "_attn_implementation", None)
        if self.spec.method.value == "qlora":
            # frozen, and the unquantised weights kept in the precision they train in: peft's
            # prepare_model_for_kbit_training would first copy them to fp32, a transient of twice the
            # embeddings' size on the GPU that DeepSpeed's cast to bf16 undoes
            model.requires_grad_(False)
        if self.run.resolved.gradient_checkpointing:
            modeling.enable_checkpointing(model, self.lora)
        if self.lora:
            model = modeling.apply_lora(model, self.spec.lora)
        return model

    # ---------------------------------------------------------------- the loop

    def plan_steps(self) -> None:
        cfg = self.ds_config
        self.grad_accum = int(cfg["gradient_accumulation_steps"])
        mbs, seed = int(cfg["train_micro_batch_size_per_gpu"]), self.spec.training.seed
        lengths = None if self.packed is not None else [len(e.input_ids) for e in self.examples]
        rows = len(self.packed) if self.packed is not None else len(self.examples)
        # every rank's order, so each rank knows how many target tokens the whole step holds
        self.orders = [MicroBatchOrder(rows, mbs, self.world, rank, seed, lengths=lengths)
                       for rank in range(self.world)]
        self.order = self.orders[self.rank]
        chunk = self.run.resolved.loss_chunk_tokens
        if chunk is not None:
            from worker._trainlib.modeling import ChunkedLoss

            self.chunked_loss: ChunkedLoss | None = ChunkedLoss(self.engine.module, chunk)
        else:
            self.chunked_loss = None
        t = self.spec.training
        self.total = total_steps(self.order, self.grad_accum, t.epochs, t.max_steps)
        self.lr_fn = lr_factor(t.lr_scheduler.value, self.total, warmup_steps(self.total, t.warmup_ratio))
        self.pad = pad_id(self.tokenizer)

    def maybe_resume(self) -> Path | None:
        found = ckpt.latest_complete(self.run.checkpoints_dir)
        if found is None:
            return None
        ckpt.resume(self.engine, found)
        self.step = found.step
        return found.path

    def _set_lr(self) -> float:
        if not self.manual_schedule:
            return float(self.engine.get_lr()[0])
        factor = self.lr_fn(self.step)
        for group, peak in zip(self.engine.optimizer.param_groups, self.peak_lrs, strict=True):
            group["lr"] = peak * factor
        return self.peak_lrs[0] * factor

    def _micro_batch(self, k: int) -> tuple[dict[str, Any], int, int]:
        import torch

        picked = self.order.indices(k)
        if self.packed is not None:
            rows = [self.packed[i] for i in picked]
            batch = collate_packed(self.examples, rows, self.spec.training.seq_len, self.pad)
            tokens = sum(len(self.examples[i].input_ids) for r in rows for i in r.members)
            samples = sum(len(r.members) for r in rows)
        else:
            batch = collate([self.examples[i] for i in picked], self.pad)
            tokens, samples = sum(map(sum, batch["attention_mask"])), len(picked)
        device = self.engine.device
        tensors = {key: torch.tensor(v, dtype=torch.long, device=device) for key, v in batch.items()}
        return tensors, tokens, samples

    def _targets(self, order: MicroBatchOrder, k: int) -> int:
        """Target tokens of micro-batch ``k`` of ``order``: the labels the causal shift predicts
        (a packed row's are its examples', none across a boundary)."""
        picked = order.indices(k)
        members = [i for r in picked for i in self.packed[r].members] if self.packed is not None else picked
        return sum(sum(1 for t in self.examples[i].labels[1:] if t != IGNORE) for i in members)

    def _reduce(self, loss: float, tokens: int, samples: int) -> tuple[float, int, int]:
        """Each rank's share of the step's loss, tokens and samples summed, so rank 0 reports the
        whole job."""
        if self.world == 1:
            return loss, tokens, samples
        import deepspeed.comm as dist
        import torch

        t = torch.tensor([loss, float(tokens), float(samples)], dtype=torch.float64,
                         device=self.engine.device)
        dist.all_reduce(t)
        return t[0].item(), int(t[1].item()), int(t[2].item())

    def train_step(self) -> dict[str, Any]:
        lr = self._set_lr()
        started = time.perf_counter()
        loss_sum, tokens, samples = 0.0, 0, 0
        first = self.step * self.grad_accum
        micro = range(first, first + self.grad_accum)
        step_targets = max(1, sum(self._targets(order, k) for order in self.orders for k in micro))
        for k in micro:
            batch, n_tokens, n_samples = self._micro_batch(k)
            if self.chunked_loss is not None:
                loss = self.chunked_loss(self.engine, batch)
            else:
                loss = self.engine(**batch, use_cache=False).loss
            self._phase("forward")
            # a micro-batch's loss is the mean over its own targets; weighed by its share of the
            # step's targets, the step optimises the mean over all of them, as one batch would.
            # DeepSpeed divides by the accumulation steps and averages the ranks' gradients.
            share = self._targets(self.order, k) / step_targets
            self.engine.backward(loss * (share * self.grad_accum * self.world))
            self._phase("backward")
            self.engine.step()
            self._phase("step")
            loss_sum += float(loss.detach().float().item()) * share
            tokens, samples = tokens + n_tokens, samples + n_samples
        self.step += 1
        loss, tokens, samples = self._reduce(loss_sum, tokens, samples)
        seconds = max(time.perf_counter() - started, 1e-9)
        return {"loss": loss, "lr": lr, "tokens_per_second": tokens / seconds,
                "samples_per_second": samples / seconds}

    def _phase(self, phase: str) -> None:
        if self.on_phase is not None:
            self.on_phase(phase)

    def report(self, stats: dict[str, Any], run_started: float, steps_this_run: int) -> None:
        per_step = (time.perf_counter() - run_started) / max(1, steps_this_run)
        epoch = self.order.epoch_of(self.step * self.grad_accum)
        self.progress.emit("progress", step=self.step, total_steps=self.total, epoch=epoch, **stats,
                           **self.meter.snapshot(), eta_seconds=per_step * (self.total - self.step))

    def save(self, loss: float | None) -> Path:
        state = {"step": self.step, "epoch": self.order.epoch_of(self.step * self.grad_accum),
                 "micro_batches": self.step * self.grad_accum, "total_steps": self.total,
                 "world_size": self.world, "job_id": self.run.job_id, "method": self.spec.method.value,
                 "loss": loss, "time": time.time()}
        path = ckpt.save(self.engine, self.tokenizer, self.run.checkpoints_dir, self.step, state,
                         lora=self.lora, is_rank0=self.is_rank0)
        self.progress.emit("checkpoint", step=self.step, path=str(path))
        keep = self.spec.training.save_total_limit
        if keep is not None and self.is_rank0:
            evaluations = self.run.job_dir / "eval" if self.spec.eval.when.value == "steps" else None
            removed = ckpt.prune(self.run.checkpoints_dir, keep, evaluations)
            if removed:
                self.progress.emit("checkpoints_removed", steps=removed, kept=keep)
        return path

    def pause_asked(self) -> bool:
        """Whether the worker asked for a pause; every rank agrees (the save is a collective)."""
        asked = (self.run.job_dir / PAUSE_FILE).exists()
        if self.world == 1:
            return asked
        import deepspeed.comm as dist
        import torch

        flag = torch.tensor([1.0 if asked else 0.0], device=self.engine.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def fit(self) -> int:
        self.preflight()
        self.load_data()
        self.build_engine()
        self.plan_steps()
        resumed = self.maybe_resume()
        self.progress.emit("start", total_steps=self.total, start_step=self.step,
                           resumed_from=str(resumed) if resumed else None, pid=os.getpid(),
                           world_size=self.world, train_rows=len(self.examples), eval_rows=self.eval_rows,
                           trainable_params=self.trainable_params,
                           gpu_memory_limit_bytes=self.gpu_memory_limit_bytes, data=self.data_report,
                           packed_rows=len(self.packed) if self.packed is not None else None,
                           attn_implementation=self.attn_implementation)
        final = resumed if resumed is not None and self.step >= self.total else None
        started, first_step, loss = time.perf_counter(), self.step, None
        save_every = self.spec.training.save_steps
        while self.step < self.total:
            stats = self.train_step()
            loss = stats["loss"]
            self.report(stats, started, self.step - first_step)
            saved = self.step % save_every == 0 or self.step == self.total
            if saved:
                final = self.save(loss)
            if self.pause_asked():
                if not saved:
                    self.save(loss)
                self.progress.emit("paused", step=self.step, total_steps=self.total)
                return EXIT_PAUSED
        self.progress.emit("done", step=self.step, final_path=str(final),
                           peak_gpu_bytes=self.meter.peak_gpu_bytes(),
                           host_peak_rss_bytes=host_peak_rss_bytes())
        return EXIT_OK


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m worker.train", description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", required=True, type=Path)
    # the deepspeed launcher appends --local_rank=N; the rank is read from the environment instead
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _fail(job_dir: Path, exc: BaseException, trainer: Trainer | None) -> int:
    failure = classify(exc)
    run = trainer.run if trainer is not None else None
    limit = run.gpu_memory_limit_bytes if run is not None and run.device == "cuda" else None
    if failure.reason == "cuda_oom" and limit is not None:
        from worker._trainlib.modeling import oom_figures

        failure = JobFailure(failure.kind, failure.reason,
                             f"{failure.message} (PyTorch was held to {limit / 2**30:.2f} GiB per GPU: the "
                             "plan's per_gpu.allocator_limit_bytes plus TUNEBOX_GPU_MEMORY_TOLERANCE)",
                             oom_figures(exc, limit, _env_int("LOCAL_RANK", 0)))
    if failure.kind != USER_ERROR or failure.reason == "error":
        traceback.print_exception(exc, file=sys.stderr)
    print(f"training failed: {failure.kind} {failure.reason}: {failure.message}", file=sys.stderr)
    if trainer is None or trainer.is_rank0 or not (job_dir / "failure.json").exists():
        write_failure(job_dir, failure)
    return failure.exit_code


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    job_dir = args.job_dir.resolve()
    signal.signal(signal.SIGTERM, _on_sigterm)
    trainer: Trainer | None = None
    try:
        if _env_int("RANK", 0) == 0:
            (job_dir / "failure.json").unlink(missing_ok=True)
        run = load_run(job_dir)
        _prepare_environment(run)
        trainer = Trainer(run)
        return trainer.fit()
    except Terminated:
        if trainer is not None:
            trainer.progress.emit("stopped", step=trainer.step, signal="SIGTERM")
        return EXIT_TERMINATED
    except Exception as exc:
        return _fail(job_dir, exc, trainer)
    finally:
        if trainer is not None:
            trainer.progress.close()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: DeepSpeed's process group and op threads can hang or crash at exit
    os._exit(code)
