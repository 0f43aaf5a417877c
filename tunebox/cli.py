"""The ``tunebox`` command: a client of the API, the local planner, and the service's admin tasks.

Client commands talk to ``TUNEBOX_URL`` (default http://127.0.0.1:8000) with ``TUNEBOX_TOKEN``;
``plan``, ``db``, ``token`` and ``settings`` work locally without a server.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from store.status import TERMINAL
from tunebox.client import ApiProblem, Client, ClientError

GiB = 2**30


class CliError(Exception):
    """A problem the user can fix, said in one line (``main`` prints it and exits 1)."""


# --------------------------------------------------------------------------- formatting


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("TiB", 2**40), ("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def progress_line(job: dict[str, Any], width: int = 24) -> str:
    """``job_x running [######------] 120/1000 12% loss 1.2345 | 5,432 tok/s | ETA 3m12s``."""
    p = job.get("progress") or {}
    step, total = p.get("step"), p.get("total_steps")
    if step is not None and total:
        done = min(1.0, step / total)
        bar = "#" * round(done * width) + "-" * (width - round(done * width))
        where = f"[{bar}] {step}/{total} {done:4.0%}"
    else:
        where = f"[{'-' * width}] {step if step is not None else 0}/?"
    return (f"{job['id']} {job['status']:<10} {where} loss {_num(p.get('loss'), '.4f')} | "
            f"{_num(p.get('tokens_per_second'), ',.0f')} tok/s | ETA {fmt_duration(p.get('eta_seconds'))}")


TOKEN_HINT = "set TUNEBOX_TOKEN to a token from `tunebox token create NAME`"


def print_problem(exc: ApiProblem, out: TextIO) -> None:
    body = exc.problem
    hint = f" ({TOKEN_HINT})" if exc.status == 401 else ""
    print(f"error {exc.status}: {body.get('title', '')}: {body.get('detail', '')}{hint}", file=out)
    for err in exc.errors:
        row = f" (row {err['row']})" if err.get("row") is not None else ""
        print(f"  {err.get('field')}: {err.get('message')}{row}", file=out)
    alternatives = body.get("alternatives")
    if alternatives:
        print("alternatives the planner suggests:", file=out)
        for alt in alternatives:
            print("  " + _alternative(alt), file=out)
    elif alternatives is not None:
        print("alternatives: none, no configuration of this box fits the job", file=out)


def _alternative(alt: dict[str, Any]) -> str:
    changes = ", ".join(f"{k}={v}" for k, v in (alt.get("changes") or {}).items())
    fits = "fits" if alt.get("fits") else "does not fit"
    return (f"{changes}: {fits}, {fmt_bytes(alt.get('per_gpu_total_bytes'))} per GPU, "
            f"{_num(alt.get('estimated_tokens_per_second'), ',.0f')} tok/s"
            + (f" ({alt['reason']})" if alt.get("reason") else ""))


def _print_fits_and_setup(plan: dict[str, Any], out: TextIO) -> None:
    r, g, h = plan["resolved"], plan["per_gpu"], plan["host"]
    verdict = "yes" if plan["fits"] else "NO"
    print(f"fits: {verdict} (margin {fmt_bytes(plan['margin_bytes'])}) on {plan['num_gpus']} GPU(s) of "
          f"{fmt_bytes(g['capacity_bytes'])}, host {fmt_bytes(h['capacity_bytes'])}", file=out)
    print(f"setup: {r['method']}, ZeRO-{r['zero_stage']}, offload optimizer={r['offload_optimizer']} "
          f"param={r['offload_param']}, micro batch {r['micro_batch_size']} x accumulation "
          f"{r['gradient_accumulation_steps']}, seq_len {r['seq_len']}, checkpointing "
          f"{'on' if r['gradient_checkpointing'] else 'off'}, {r['precision']}"
          + (f", loss in chunks of {r['loss_chunk_tokens']}" if r.get("loss_chunk_tokens") else ""), file=out)


def _print_peak_and_speed(plan: dict[str, Any], out: TextIO) -> None:
    g, h = plan["per_gpu"], plan["host"]
    print(f"  peak ({g['peak_phase']}): {fmt_bytes(g['total_bytes'])} of {fmt_bytes(g['capacity_bytes'])}",
          file=out)
    print(f"host: {fmt_bytes(h['total_bytes'])} of {fmt_bytes(h['capacity_bytes'])}", file=out)
    print(f"speed: {plan['estimated_step_seconds']:.2f} s/step, "
          f"{plan['estimated_tokens_per_second']:,.0f} tokens/s, "
          f"duration {fmt_duration(plan.get('estimated_duration_seconds'))}", file=out)


def _print_warnings(plan: dict[str, Any], out: TextIO) -> None:
    for note in plan.get("warnings") or []:
        print(f"warning: {note['message']}", file=out)


def _print_hardware(plan: dict[str, Any], out: TextIO) -> None:
    hw = plan.get("hardware")
    if not hw:
        return
    card = hw["card"] or f"{hw['gpu_name'] or 'no named card'} (not in the GPU catalogue)"
    f, p, b = hw["gpu_flops"], hw["pcie_bytes_per_s"], hw["gpu_memory_bandwidth"]
    print(f"planned for: {card}; memory from {hw['gpu_memory_bytes']['source']}, "
          f"{f['value'] / 1e12:.0f} TFLOPS from {f['source']}, memory bandwidth {b['value'] / 1e9:.0f} GB/s "
          f"from {b['source']}, PCIe {p['value'] / 1e9:.1f} GB/s from "
          f"{p['source']}, step-time factor {hw['step_time_factor']['value']:.2f} from "
          f"{hw['step_time_factor']['source']}, memory correction "
          f"{hw['gpu_memory_correction']['value']:.2f} from {hw['gpu_memory_correction']['source']}",
          file=out)


def print_plan(plan: dict[str, Any], out: TextIO) -> None:
    g = plan["per_gpu"]
    _print_fits_and_setup(plan, out)
    _print_hardware(plan, out)
    terms = ["weights", "gradients", "optimizer_states", "activations", "logits", "zero_buffers",
             "gathered_parameters", "cuda_context", "allocator_slack"]
    parts = ", ".join(f"{t.replace('_', ' ')} {fmt_bytes(g.get(t + '_bytes'))}" for t in terms)
    print(f"per GPU: {parts}", file=out)
    _print_peak_and_speed(plan, out)
    _print_warnings(plan, out)
    for note in plan.get("advice") or []:
        print(f"advice: {note['message']}", file=out)
    for alt in plan.get("alternatives") or []:
        print("alternative: " + _alternative(alt), file=out)


def print_plan_summary(plan: dict[str, Any], out: TextIO) -> None:
    """What a submitted job was accepted with: fits, setup, peak, speed and every warning."""
    _print_fits_and_setup(plan, out)
    _print_peak_and_speed(plan, out)
    _print_warnings(plan, out)


# --------------------------------------------------------------------------- spec files


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{path}: is a folder, not a spec file") from None
    except PermissionError:
        raise CliError(f"{path}: not readable (permission denied)") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def _yaml_error(path: str, exc: Exception) -> CliError:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return CliError(f"{path}: not valid YAML or JSON: {where}{problem}")


def load_spec(path: str) -> dict[str, Any]:
    """A spec from a YAML or JSON file (``-`` reads standard input)."""
    import yaml

    text = _read_text(path)
    try:
        data = yaml.safe_load(text)  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    if not isinstance(data, dict):
        raise CliError(f"{path}: a job spec is a mapping (YAML or JSON object)")
    return data


def _json_beside(path: str, named: str, what: str) -> dict[str, Any]:
    """A JSON file a config names: as given, beside the config, or by its name beside the config."""
    import json

    base = Path(path).parent
    for candidate in (Path(named), base / named, base / Path(named).name):
        if candidate.is_file():
            try:
                data = json.loads(candidate.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise CliError(f"{candidate}: not valid JSON: {exc}") from None
            if isinstance(data, dict):
                return data
            raise CliError(f"{candidate}: {what} is a JSON object")
    raise CliError(f"{path}: {what} {named!r} not found (as given, or beside the config)")


def spec_from_llamafactory(path: str) -> dict[str, Any]:
    """The job spec of a LLaMA-Factory training YAML; prints it and the keys it does not take (stderr)."""
    import yaml

    from planner import PlanError
    from planner.llamafactory import convert

    config = load_spec(path)
    deepspeed = _json_beside(path, str(config["deepspeed"]), "the DeepSpeed config") \
        if config.get("deepspeed") else None
    info_path = Path(str(config.get("dataset_dir", "data"))) / "dataset_info.json"
    info = _json_beside(path, str(info_path), "dataset_info.json") if info_path.is_file() else None
    try:
        converted = convert(config, deepspeed=deepspeed, dataset_info=info)
    except PlanError as exc:
        raise CliError(f"{path}: {exc.field}: {exc.message}") from None
    print(f"# the tunebox spec of {path}", file=sys.stderr)
    print(yaml.safe_dump(converted.spec, sort_keys=False).rstrip(), file=sys.stderr)
    if converted.unmapped:
        print(f"# not taken from {path}:", file=sys.stderr)
        for key, why in converted.unmapped.items():
            print(f"#   {key}: {why}", file=sys.stderr)
    return converted.spec


# --------------------------------------------------------------------------- client commands


def cmd_submit(args: argparse.Namespace, client: Client) -> int:
    spec = spec_from_llamafactory(args.spec) if args.source == "llamafactory" else load_spec(args.spec)
    job = client.submit(spec, idempotency_key=args.idempotency_key)
    print(job["id"], flush=True)  # alone on standard output, for scripts; the plan goes to stderr
    if job.get("plan"):
        print_plan_summary(job["plan"], sys.stderr)
    return 0


def cmd_jobs(args: argparse.Namespace, client: Client) -> int:
    page = client.jobs(statuses=args.status or (), owner=None if args.all else "me", limit=args.limit)
    print(f"{'ID':<26} {'STATUS':<10} {'OWNER':<12} {'STEP':>11} {'LOSS':>8}  {'CREATED':<20} NAME")
    for job in page["items"]:
        p = job.get("progress") or {}
        step = f"{p.get('step') or 0}/{p.get('total_steps') or '?'}"
        print(f"{job['id']:<26} {job['status']:<10} {job['owner'][:12]:<12} {step:>11} "
              f"{_num(p.get('loss'), '.4f'):>8}  {job['created_at'][:19]:<20} {job['name']}")
    if page.get("next_after"):
        print(f"(more: --limit {args.limit * 2})")
    return 0


def cmd_queue(args: argparse.Namespace, client: Client) -> int:
    data = client.queue(limit=args.limit)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    if not data["items"]:
        print("the queue is empty")
        return 0
    print(f"{'#':>3} {'ID':<26} {'OWNER':<12} {'PRIORITY':>8} {'GPUS':>4} {'PEAK/GPU':>10}  "
          f"{'QUEUED SINCE':<20} NAME")
    for position, job in enumerate(data["items"], 1):
        print(f"{position:>3} {job['id']:<26} {job['owner'][:12]:<12} {job['priority']:>8} "
              f"{job['num_gpus']:>4} {fmt_bytes(job['planned_peak_gpu_bytes']):>10}  "
              f"{job['created_at'][:19]:<20} {job['name']}")
    if data.get("more"):
        print(f"(and {data['more']} more: --limit)")
    return 0


def cmd_events(args: argparse.Namespace, client: Client) -> int:
    events = client.all_events(args.id)
    if args.json:
        print(json.dumps(events, indent=2))
        return 0
    for e in events:
        print(f"{e['created_at'][:19]}  {e['kind']:<11} {(e['actor'] or '-')[:20]:<20} {e['message']}")
    return 0


def cmd_metrics(args: argparse.Namespace, client: Client) -> int:
    series = client.metrics(args.id, kind=args.kind)
    if args.json:
        print(json.dumps(series, indent=2))
        return 0
    print(f"{'STEP':>7} {'EPOCH':>6} {'LOSS':>9} {'LR':>10} {'TOKENS/S':>10} {'GPU PEAK':>10} "
          f"{'HOST RSS':>10}")
    for p in series["points"]:
        print(f"{p['step']:>7} {_num(p['epoch'], '.2f'):>6} {_num(p['loss'], '.4f'):>9} "
              f"{_num(p['learning_rate'], '.3g'):>10} {_num(p['tokens_per_second'], '.0f'):>10} "
              f"{fmt_bytes(p['gpu_memory_bytes']):>10} {fmt_bytes(p['host_rss_bytes']):>10}")
    return 0


def cmd_checkpoints(args: argparse.Namespace, client: Client) -> int:
    data = client.checkpoints(args.id)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"{'STEP':>7} {'SIZE':>10} {'FINAL':<5} {'EVAL':<10} {'EVAL LOSS':>9}  PATH")
    for c in data["items"]:
        loss = (c.get("eval_result") or {}).get("eval_loss")
        print(f"{c['step']:>7} {fmt_bytes(c['size_bytes']):>10} {'yes' if c['is_final'] else '':<5} "
              f"{c['eval_status'] or '-':<10} {_num(loss, '.4f'):>9}  {c['path']}")
    return 0


def cmd_datasets(args: argparse.Namespace, client: Client) -> int:
    if args.dataset_command == "upload":
        made = client.upload_dataset(args.file, name=args.name, fmt=args.format, shared=args.shared)
        print(made["id"], flush=True)  # alone on standard output, for scripts
        print(f"{made['num_rows']} {made['format']} rows, {fmt_bytes(made['size_bytes'])}: "
              f"dataset.id {made['id']} in a job spec", file=sys.stderr)
        return 0
    if args.dataset_command == "share":
        changed = client.update_dataset(args.id, shared=not args.off)
        print(f"{changed['id']} is {'shared with every user' if changed['shared'] else 'yours alone'}")
        return 0
    items = client.all_datasets()
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    print(f"{'ID':<26} {'OWNER':<12} {'FORMAT':<8} {'ROWS':>8} {'SIZE':>10} {'SHARED':<6} NAME")
    for d in items:
        print(f"{d['id']:<26} {d['owner'][:12]:<12} {d['format']:<8} {d['num_rows']:>8} "
              f"{fmt_bytes(d['size_bytes']):>10} {'yes' if d['shared'] else 'no':<6} {d['name']}")
    return 0


def _probe_line(box: dict[str, Any]) -> str:
    if box["status"] != "ok":
        return (f"probe of {box['host']}: failed ({box['error']}); plans use the GPU catalogue, "
                "then the settings")
    f = box["figures"]
    parts = [f"{label} {_num(f.get(key), fmt)}{unit}" for label, key, fmt, unit in (
        ("matmul", "matmul_tflops", ".1f", " TFLOPS"), ("h2d", "h2d_pinned_gbps", ".1f", " GB/s"),
        ("d2h", "d2h_pinned_gbps", ".1f", " GB/s"), ("cpu adam", "cpu_adam_elements_per_s", ".3g", "/s"))
        if f.get(key) is not None]
    if f.get("cuda_context_bytes") is not None:
        parts.append(f"context {fmt_bytes(f['cuda_context_bytes'])}")
    if f.get("nccl_bytes") is not None:
        parts.append(f"nccl {fmt_bytes(f['nccl_bytes'])}")
    if f.get("host_memory_available_bytes") is not None:
        parts.append(f"host free {fmt_bytes(f['host_memory_available_bytes'])}")
    if f.get("nvme_free_bytes") is not None:
        parts.append(f"disk free {fmt_bytes(f['nvme_free_bytes'])} at {f.get('nvme_dir')}")
    missing = "; ".join(f"{k}: {v}" for k, v in (f.get("errors") or {}).items())
    line = f"probe of {box['host']} ({box['updated_at'][:19]}): {', '.join(parts) or 'no figures'}"
    return line + (f" [not measured: {missing}]" if missing else "")


def cmd_gpus(args: argparse.Namespace, client: Client) -> int:
    data = client.gpus()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"{'HOST':<16} {'#':>2} {'NAME':<28} {'TOTAL':>10} {'UNLEASED':>10} {'LEASES':>6}  HEALTH")
    for g in data["items"]:
        health = "ok" if g["healthy"] else f"out: {g['health_reason']}"
        print(f"{g['host'][:16]:<16} {g['index']:>2} {g['name'][:28]:<28} "
              f"{fmt_bytes(g['memory_total_bytes']):>10} {fmt_bytes(g['memory_unleased_bytes']):>10} "
              f"{len(g['leases']):>6}  {health}")
    for box in data.get("boxes", []):
        print(_probe_line(box))
    return 0


def cmd_show(args: argparse.Namespace, client: Client) -> int:
    job = client.job(args.id)
    if args.json:
        print(json.dumps(job, indent=2))
        return 0
    print(progress_line(job))
    print(f"name: {job['name']}  owner: {job['owner']}  priority: {job['priority']}  gpus: {job['num_gpus']}")
    print(f"planned: {fmt_bytes(job['planned_peak_gpu_bytes'])} per GPU, "
          f"{fmt_bytes(job['planned_host_bytes'])} host; measured peak "
          f"{fmt_bytes((job.get('progress') or {}).get('measured_peak_gpu_bytes'))}")
    print(f"created {job['created_at']}  started {job['started_at'] or '-'}  "
          f"finished {job['finished_at'] or '-'}")
    if job.get("failure"):
        f = job["failure"]
        print(f"failure: {f['kind']} / {f['reason']}: {f['message']}")
    return 0


def cmd_cancel(args: argparse.Namespace, client: Client) -> int:
    job = client.cancel(args.id)
    print(f"{job['id']} {job['status']}")
    return 0


def cmd_export(args: argparse.Namespace, client: Client) -> int:
    import tempfile

    from tunebox import export

    dest = Path(args.dest)
    with tempfile.TemporaryDirectory() as tmp:
        archive = client.download(args.id, Path(tmp) / "checkpoint.tar.gz", step=args.checkpoint)
        folder = export.unpack(archive, Path(tmp) / "unpacked")
        if not args.merge or not export.is_adapter(folder):
            export.copy_folder(folder, dest)  # a full fine-tune's checkpoint is a whole model already
        else:
            base = Path(args.base or client.job(args.id)["spec"]["model"]["path"])
            if not (base / "config.json").is_file():
                raise CliError(f"{base}: the base model folder is not here; name it with --base")
            export.merge(folder, base, dest)
    print(dest)
    return 0


def cmd_pause(args: argparse.Namespace, client: Client) -> int:
    job = client.pause(args.id)
    print(f"{job['id']} {job['status']}")
    return 0


def cmd_resume(args: argparse.Namespace, client: Client) -> int:
    job = client.resume(args.id)
    print(f"{job['id']} {job['status']}")
    return 0


def watch(client: Client, job_id: str, *, interval: float, out: TextIO,
          sleep: Callable[[float], None] = time.sleep) -> int:
    """Redraw the progress line until the job ends; 0 if it succeeded, 1 otherwise."""
    live = out.isatty()
    last = ""
    while True:
        job = client.job(job_id)
        line = progress_line(job)
        if line != last:
            print(("\r\x1b[2K" + line) if live else line, end="" if live else "\n", file=out, flush=True)
            last = line
        if job["status"] in TERMINAL:
            if live:
                print(file=out)
            failure = job.get("failure")
            if failure:
                print(f"{job['status']}: {failure.get('reason')}: {failure.get('message')}", file=out)
            return 0 if job["status"] == "succeeded" else 1
        sleep(interval)


def cmd_logs(args: argparse.Namespace, client: Client) -> int:
    last = "\n"
    for text in client.logs(args.id, tail=args.tail, follow=args.follow):
        sys.stdout.write(text)
        sys.stdout.flush()
        last = text[-1:] or last
    if last != "\n":
        print()  # a log cut mid-line (the run died) still ends the terminal's line
    return 0


def cmd_watch(args: argparse.Namespace, client: Client) -> int:
    return watch(client, args.id, interval=args.interval, out=sys.stdout)


# --------------------------------------------------------------------------- local commands


def _flag_hardware(args: argparse.Namespace) -> Any:
    from planner.spec import HardwareSpec

    if args.gpu_memory_gib is None and args.gpus is None:
        return None
    if args.gpu_memory_gib is None:
        raise CliError("--gpus needs --gpu-memory-gib")
    host = args.host_memory_gib * GiB if args.host_memory_gib else _host_memory()
    return HardwareSpec(gpu_count=args.gpus or 1, gpu_memory_bytes=int(args.gpu_memory_gib * GiB),
                        host_memory_bytes=int(host))


def _host_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def _local_hardware() -> Any:
    from planner.spec import HardwareSpec
    from tunebox.gpus import local_inventory, nvme_unavailable
    from tunebox.settings import Settings

    settings = Settings()
    gpus = [g for g in local_inventory(settings) if g.healthy]
    if not gpus:
        raise CliError("no GPU found here: give spec.hardware, or --gpus N --gpu-memory-gib X")
    return HardwareSpec(gpu_count=len(gpus), gpu_memory_bytes=min(g.memory_total_bytes for g in gpus),
                        host_memory_bytes=settings.host_memory_bytes or _host_memory(),
                        nvme_bytes=settings.nvme_bytes,
                        nvme_unavailable=nvme_unavailable(settings))


def cmd_plan(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from planner import PlanError, plan
    from planner.spec import JobSpec

    try:
        spec = JobSpec.model_validate(load_spec(args.spec))
        hardware = spec.hardware or _flag_hardware(args) or _local_hardware()
        result = plan(spec, hardware=hardware)
    except ValidationError as exc:
        for err in exc.errors():
            print(f"  {'.'.join(map(str, err['loc'])) or 'spec'}: {err['msg']}", file=sys.stderr)
        return 2
    except PlanError as exc:
        print(f"  {exc.field}: {exc.message}", file=sys.stderr)
        return 2
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        print_plan(result.model_dump(mode="json"), sys.stdout)
    return 0 if result.fits else 1


def print_inspection(report: dict[str, Any], out: Any) -> None:
    t = report["tokens_per_row"]
    dropped = ", ".join(f"{n} {why}" for why, n in report["dropped"].items()) or "none"
    print(f"format          {report['format']}", file=out)
    print(f"rows            {report['rows']}  (kept {report['kept_rows']})", file=out)
    print(f"tokens per row  p50 {t['p50']}  p95 {t['p95']}  max {t['max']}", file=out)
    print(f"truncated rows  {report['truncated_rows']}  (to seq_len {report['seq_len']})", file=out)
    print(f"dropped rows    {report['dropped_rows']}  ({dropped})", file=out)
    if report["dropped_row_numbers"]:
        print(f"                rows {', '.join(map(str, report['dropped_row_numbers']))}", file=out)
    print(f"tokens          {report['tokens']}  (trained {report['trained_tokens']})", file=out)
    if report.get("packed_rows"):
        fill = report["tokens"] / (report["packed_rows"] * report["seq_len"])
        print(f"packed rows     {report['packed_rows']}  ({fill:.0%} full)", file=out)
    if report.get("example"):
        print("example (trained text between \u27e6 \u27e7):", file=out)
        print(report["example"]["marked"], file=out)


def cmd_dataset(args: argparse.Namespace) -> int:
    from worker.inspect_data import main as inspect_main

    argv = [str(args.file), "--model", str(args.model), "--seq-len", str(args.seq_len),
            "--format", args.format]
    if args.name:
        argv += ["--name", args.name]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = inspect_main(argv)
    report = json.loads(buffer.getvalue())
    if code != 0:
        error = report["error"]
        row = f" (row {error['row']})" if error.get("row") else ""
        print(f"  {error['field']}: {error['message']}{row}", file=sys.stderr)
        return code
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print_inspection(report, sys.stdout)
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    import migrations
    from tunebox.settings import Settings

    settings = Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)  # the embedded SQLite file's folder
    url = settings.resolved_database_url
    if args.db_command == "upgrade":
        migrations.upgrade(url, args.revision)
    elif args.db_command == "downgrade":
        migrations.downgrade(url, args.revision)
    print(f"database at revision {migrations.current(url) or 'base'}")
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from api.auth.service import TokenNotFound, create_token, revoke_token
    from store.db import session_scope
    from tunebox.serve import ensure_database
    from tunebox.settings import Settings

    settings = Settings()
    ensure_database(settings)  # a token before the first `serve` needs the database made
    url = settings.resolved_database_url
    with session_scope(url) as session:
        if args.token_command == "create":
            issued = create_token(session, args.name, admin=True if args.admin else None)
            print(issued.token)
            role = "admin" if issued.user.is_admin else "user"
            print(f"token {issued.prefix}… for {issued.user.name} ({role}); it is shown only once",
                  file=sys.stderr)
            return 0
        try:
            row = revoke_token(session, args.prefix)
        except TokenNotFound as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"revoked {row.prefix}… ({row.id})")
        return 0


def _show_default(value: Any) -> str:
    if isinstance(value, Path):
        home = str(Path.home())
        return "~" + str(value)[len(home):] if str(value).startswith(home) else str(value)
    return json.dumps(value)


def settings_markdown() -> str:
    from pydantic_core import PydanticUndefined

    from tunebox.settings import Settings

    lines = ["| Variable | Default | Description |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        if field.default_factory is not None:
            default = f"`{_show_default(field.default_factory())}`"  # type: ignore[call-arg]
        elif field.default is PydanticUndefined or field.default is None:
            default = ""
        else:
            value = field.default
            default = f"`{value if isinstance(value, str) else json.dumps(value)}`"
        description = (field.description or "").replace("|", "\\|")
        lines.append(f"| `TUNEBOX_{name.upper()}` | {default} | {description} |")
    return "\n".join(lines)


def cmd_settings(args: argparse.Namespace) -> int:
    if args.markdown:
        print(settings_markdown())
        return 0
    from tunebox.settings import Settings

    for name, value in Settings().model_dump(mode="json").items():
        print(f"TUNEBOX_{name.upper()}={json.dumps(value) if not isinstance(value, str) else value}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    # run_serve migrates the embedded SQLite database before it serves
    from tunebox.serve import run_serve

    return int(run_serve(args.host, args.port))


def cmd_worker(args: argparse.Namespace) -> int:
    from tunebox.serve import run_worker

    return int(run_worker())


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tunebox", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("submit", help="submit a job spec (YAML or JSON); prints the job id")
    p.add_argument("spec")
    p.add_argument("--from", dest="source", choices=("tunebox", "llamafactory"), default="tunebox",
                   help="llamafactory: a LLaMA-Factory training YAML, converted and printed first")
    p.add_argument("--idempotency-key", help="resubmitting with the same key never makes a second job")
    p.set_defaults(client_command=cmd_submit)

    p = sub.add_parser("jobs", help="list jobs (yours unless --all)")
    p.add_argument("--status", action="append", help="repeat to match several")
    p.add_argument("--all", action="store_true", help="everyone's jobs")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(client_command=cmd_jobs)

    def server(name: str, command: Any, summary: str, *, job: bool = True, json_flag: bool = False
               ) -> argparse.ArgumentParser:
        """A command that asks the server; ``job``: about one job, named by its id."""
        cmd = sub.add_parser(name, help=summary)
        if job:
            cmd.add_argument("id")
        if json_flag:
            cmd.add_argument("--json", action="store_true")
        cmd.set_defaults(client_command=command)
        return cmd

    server("show", cmd_show, "one job", json_flag=True)
    p = server("watch", cmd_watch, "live progress until the job ends (exit 0 if it succeeded)")
    p.add_argument("--interval", type=float, default=2.0)
    p = server("logs", cmd_logs, "a job's training log")
    p.add_argument("-n", "--tail", type=int, help="only the last N lines")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p = server("queue", cmd_queue, "the queued jobs in the order they will start", job=False, json_flag=True)
    p.add_argument("--limit", type=int, default=200)
    server("events", cmd_events, "a job's events, oldest first", json_flag=True)
    p = server("metrics", cmd_metrics, "a job's recorded steps (loss, learning rate, speed, memory)",
               json_flag=True)
    p.add_argument("--kind", choices=("train", "eval"), default="train")
    server("checkpoints", cmd_checkpoints, "a job's checkpoints and their evaluations", json_flag=True)
    server("gpus", cmd_gpus, "the GPUs, their leases and each box's probe", job=False, json_flag=True)
    server("cancel", cmd_cancel, "cancel a job")
    p = server("export", cmd_export, "a job's final adapter (or a checkpoint) into DEST; --merge: merged")
    p.add_argument("dest")
    p.add_argument("--checkpoint", type=int, help="the checkpoint of this step instead of the final adapter")
    p.add_argument("--merge", action="store_true", help="merge the adapter into its base model (bf16)")
    p.add_argument("--base", help="the base model folder; default: the job's model.path")
    server("pause", cmd_pause, "pause a running job: it checkpoints at its next step, frees its GPUs")
    server("resume", cmd_resume, "queue a paused job again; it continues from its checkpoint")

    p = sub.add_parser("plan", help="run the planner locally (no server)")
    p.add_argument("spec")
    p.add_argument("--json", action="store_true", help="the plan as POST /v1/plans returns it")
    p.add_argument("--gpus", type=int)
    p.add_argument("--gpu-memory-gib", type=float)
    p.add_argument("--host-memory-gib", type=float)
    p.set_defaults(local_command=cmd_plan)

    p = sub.add_parser("datasets", help="the datasets on the server: list, upload, share")
    dssub = p.add_subparsers(dest="dataset_command")
    p.add_argument("--json", action="store_true")
    p.set_defaults(client_command=cmd_datasets, dataset_command="list")
    up = dssub.add_parser("upload", help="upload a JSON Lines (or JSON array) file; prints its dataset id")
    up.add_argument("file", type=Path)
    up.add_argument("--name", help="default: the file's name")
    up.add_argument("--format", default="auto", help="auto | alpaca | sharegpt | openai | text")
    up.add_argument("--shared", action="store_true", help="every user may train on it")
    share = dssub.add_parser("share", help="share a dataset with every user (--off: yours alone again)")
    share.add_argument("id")
    share.add_argument("--off", action="store_true")

    p = sub.add_parser("dataset", help="datasets, locally (no server)")
    dssub = p.add_subparsers(dest="dataset_command", required=True)
    ins = dssub.add_parser("inspect", help="what training makes of a dataset: rows, tokens, truncated and "
                           "dropped rows, a rendered example with its trained text marked")
    ins.add_argument("file", type=Path)
    ins.add_argument("--model", type=Path, required=True, help="a local Hugging Face model folder")
    ins.add_argument("--seq-len", type=int, required=True)
    ins.add_argument("--format", default="auto", help="auto | alpaca | sharegpt | openai | text")
    ins.add_argument("--name", help="the entry of a LLaMA-Factory dataset_info.json")
    ins.add_argument("--json", action="store_true")
    p.set_defaults(local_command=cmd_dataset)

    p = sub.add_parser("db", help="database migrations")
    dbsub = p.add_subparsers(dest="db_command", required=True)
    up = dbsub.add_parser("upgrade")
    up.add_argument("revision", nargs="?", default="head")
    down = dbsub.add_parser("downgrade")
    down.add_argument("revision")
    dbsub.add_parser("current")
    p.set_defaults(local_command=cmd_db)

    p = sub.add_parser("token", help="API tokens")
    toksub = p.add_subparsers(dest="token_command", required=True)
    create = toksub.add_parser("create", help="create the user if needed; print a new token once")
    create.add_argument("name")
    create.add_argument("--admin", action="store_true")
    revoke = toksub.add_parser("revoke", help="revoke by display prefix (tb_xxxxxxxx) or tok_ id")
    revoke.add_argument("prefix")
    p.set_defaults(local_command=cmd_token)

    p = sub.add_parser("settings", help="the effective settings, or --markdown for the README table")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(local_command=cmd_settings)

    p = sub.add_parser("serve", help="run the API (and, on the embedded default, a worker)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(local_command=cmd_serve)

    p = sub.add_parser("worker", help="run a GPU worker")
    p.set_defaults(local_command=cmd_worker)
    return parser


def _run(args: argparse.Namespace) -> int:
    if hasattr(args, "local_command"):
        return int(args.local_command(args))
    with Client() as client:
        return int(args.client_command(args, client))


def _database_error(exc: Exception) -> str:
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
    return f"error: the database failed: {reason} (is it migrated? `tunebox db upgrade`)"


def _quiet_stdout() -> None:
    """After the reader of a pipe left (``| head``): send what is still buffered nowhere."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from tunebox.serve import DatabaseNotReady

    args = build_parser().parse_args(argv)
    try:
        code = _run(args)
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not at interpreter exit
        return code
    except ApiProblem as exc:
        print_problem(exc, sys.stderr)
    except ClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except (CliError, DatabaseNotReady) as exc:
        print(f"error: {exc}", file=sys.stderr)
    except SQLAlchemyError as exc:
        print(_database_error(exc), file=sys.stderr)
    except BrokenPipeError:
        _quiet_stdout()
        return 0  # the reader has what it wanted
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
