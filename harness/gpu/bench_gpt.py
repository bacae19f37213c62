#!/usr/bin/env python3
"""GPT with variable-length batches, without and with spillway, on a real GPU (docs/gpu.md).

    python3 harness/gpu/bench_gpt.py --steps 20 --budgets 100%,60%,40% --out bench-out

Runs, each in its own process with the same seeds and data:
  1. baseline: PyTorch's own allocator (no spillway);
  2. spillway-off: libspillway.so preloaded, SPILLWAY_MODE=off (spillway serves every
     allocation, no budget, no eviction): the control for the bitwise comparison;
  3. spillway at each budget: SPILLWAY_GPU_BUDGET = fraction x the reference peak, in
     bytes. The reference (--budget-of) is the baseline's max_memory_reserved, what
     the job holds without spillway (default), or spillway-off's peak resident bytes.
Reports peak memory, median step time, bytes moved, and whether every parameter,
gradient and loss after N steps is bitwise equal (torch.equal) to the baseline's.
Writes OUT/results.md (a markdown table) and OUT/results.json. Exit status: 0 when
every run finished and matched, 1 otherwise, 2 when there is no GPU.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_LIB = os.path.join(REPO, "build", "lib", "libspillway.so")


def parse_budgets(text):
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part.endswith("GiB"):
            try:
                v = float(part[:-3])
            except ValueError:
                raise argparse.ArgumentTypeError(f"'{part}': not a size in GiB")
            if v <= 0:
                raise argparse.ArgumentTypeError(f"'{part}': must be above 0GiB")
            out.append(part)
            continue
        if not part.endswith("%"):
            raise argparse.ArgumentTypeError(f"'{part}': budgets are percentages such as 60% "
                                             "or sizes such as 40GiB")
        try:
            v = float(part[:-1])
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{part}': not a percentage")
        if not 0 < v <= 1000:
            raise argparse.ArgumentTypeError(f"'{part}': must be above 0%")
        out.append(v)
    if not out:
        raise argparse.ArgumentTypeError("no budget given")
    return out


def budget_bytes(entry, peak):
    """A --budgets entry in bytes: a size in GiB, or a percentage of `peak`."""
    if isinstance(entry, str):
        return int(float(entry[:-3]) * 2**30)
    return int(peak * entry / 100)


def budget_label(entry):
    return f"spillway-{entry}" if isinstance(entry, str) else f"spillway-{entry:g}%"


def budget_runs(args, peak):
    """(label, spillway environment) of each budgeted run, in the order they run: interleaved
    (A B A B, not A A B B) so that a drift of the machine over the call falls on no one variant."""
    runs = []
    for rep in range(1, args.repeat + 1):
        for entry in args.budgets:
            for variant in [None] + args.variants:
                label = budget_label(entry)
                env = {"SPILLWAY_GPU_BUDGET": str(budget_bytes(entry, peak))}
                if variant:
                    label += "+" + variant[0].removeprefix("SPILLWAY_") + "=" + variant[1]
                    env[variant[0]] = variant[1]
                if args.repeat > 1:
                    label += f"-r{rep}"
                runs.append((label, env))
    return runs


def positive_int(text):
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"'{text}': expected a whole number of at least 1")
    return v


def parse_setting(text):
    """A --set entry: a spillway variable and its value, e.g. SPILLWAY_PLAN=off (the budget and
    mode are bench_gpt's own)."""
    name, eq, value = text.partition("=")
    if not eq or not name.startswith("SPILLWAY_") or name in ("SPILLWAY_GPU_BUDGET", "SPILLWAY_MODE"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a spillway variable=value (docs/config.md), such as "
            "SPILLWAY_PLAN=off, other than SPILLWAY_GPU_BUDGET and SPILLWAY_MODE")
    return name, value


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="docs/gpu.md: what it checks and what to report.")
    p.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    p.add_argument("--budgets", type=parse_budgets, default=parse_budgets("100%,60%,40%"),
                   help="budgets: percentages of the reference peak, or sizes such as 40GiB "
                        "(default 100%%,60%%,40%%)")
    p.add_argument("--budget-of", choices=("baseline", "spillway-off"), default="baseline",
                   help="the reference peak: the baseline's max_memory_reserved (default) or "
                        "spillway-off's peak_resident_bytes")
    p.add_argument("--device", default="cuda:0", help="torch device (default cuda:0)")
    p.add_argument("--out", default="bench_gpt_out", help="output directory (default bench_gpt_out)")
    p.add_argument("--lib", default=DEFAULT_LIB, help="libspillway.so (default: build/lib/ of this tree)")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the median step time (default 2)")
    p.add_argument("--set", dest="settings", action="append", default=[], type=parse_setting,
                   metavar="VARIABLE=VALUE",
                   help="a spillway setting for every spillway run (repeatable), e.g. "
                        "SPILLWAY_HOST_RESERVE=100%%; the runs' environment is otherwise cleared of SPILLWAY_*")
    p.add_argument("--variant", dest="variants", action="append", default=[], type=parse_setting,
                   metavar="VARIABLE=VALUE",
                   help="run each budget a second time with this setting added (repeatable: one "
                        "more run per variant), so that both share one baseline, e.g. "
                        "SPILLWAY_HOST_RESERVE=50%%")
    p.add_argument("--repeat", type=positive_int, default=1,
                   help="run the budgets (and their variants) this many times, interleaved, to show "
                        "the spread between runs (default 1)")
    g = p.add_argument_group("model (harness/models/gpt_varlen.py)")
    g.add_argument("--batch", type=int, default=4)
    g.add_argument("--vocab", type=int, default=32000)
    g.add_argument("--d", type=int, default=768, help="model width")
    g.add_argument("--layers", type=int, default=12)
    g.add_argument("--heads", type=int, default=12)
    g.add_argument("--median-len", type=int, default=256, help="median sequence length")
    g.add_argument("--max-len", type=int, default=512, help="longest ordinary sequence")
    g.add_argument("--long-len", type=int, default=1024, help="length of the one long batch (mid-run)")
    g.add_argument("--dropout", type=float, default=0.1)
    g.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # run label, internal
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.warmup >= args.steps:
        args.warmup = 0
    return args


# ----------------------------------------------------------------------------
# the child: one training run
# ----------------------------------------------------------------------------
def load_model_module():
    sys.path.insert(0, os.path.join(REPO, "harness", "models"))
    import gpt_varlen
    return gpt_varlen


def run_child(args):
    import torch

    label = args.child
    out = os.path.join(args.out, "runs")
    spillway = None
    if label != "baseline":
        import spillway  # on PYTHONPATH through the preload's bootstrap (docs/python.md)
        if not spillway.enabled():
            raise SystemExit(f"bench_gpt[{label}]: spillway is not serving this process "
                             "(see the bootstrap's warning above)")
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    cuda = dev.type == "cuda"  # (cpu only for the tests' smoke run of the baseline child)
    if cuda:
        torch.cuda.manual_seed_all(args.seed)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gv = load_model_module()
    job = gv.build(steps=args.steps, batch=args.batch, vocab=args.vocab, d=args.d, layers=args.layers,
                   heads=args.heads, median=args.median_len, sigma=0.5, lo=16, hi=args.max_len,
                   long_step=args.steps // 2, long_len=args.long_len, dropout=args.dropout,
                   seed=args.seed)
    model = job["model"].to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    torch.manual_seed(args.seed + 2)  # dropout's stream, the same in every run
    times, losses = [], []
    for idx, tgt in job["batches"]:
        idx, tgt = idx.to(dev), tgt.to(dev)
        sync()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = job["loss_fn"](model(idx), tgt)
        loss.backward()
        if args.steps > 1 and len(times) < args.steps - 1:
            opt.step()  # steps are marked by the bootstrap's optimizer hook under spillway
        sync()
        times.append(time.perf_counter() - t)
        losses.append(loss.detach().cpu())
    # the last step's gradients are kept (no optimizer step after them) and compared
    tensors = {"loss." + str(i): l for i, l in enumerate(losses)}
    for name, prm in model.named_parameters():
        tensors["param." + name] = prm.detach().cpu()
        if prm.grad is not None:
            tensors["grad." + name] = prm.grad.detach().cpu()
    os.makedirs(out, exist_ok=True)
    torch.save(tensors, os.path.join(out, f"{label}.pt"))
    res = {"label": label, "step_times_s": times, "sequence_lengths": job["meta"]["sequence_lengths"],
           "torch": torch.__version__, "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu"}
    if spillway is None and cuda:
        res["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
        res["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(dev)
    elif spillway is not None:
        res["spillway_stats"] = spillway.stats()
    with open(os.path.join(out, f"{label}.json"), "w") as f:
        json.dump(res, f, indent=2)
    return 0


# ----------------------------------------------------------------------------
# the parent
# ----------------------------------------------------------------------------
def child_cmd(args, label):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", label,
           "--steps", str(args.steps), "--device", args.device, "--out", args.out,
           "--warmup", str(args.warmup), "--batch", str(args.batch), "--vocab", str(args.vocab),
           "--d", str(args.d), "--layers", str(args.layers), "--heads", str(args.heads),
           "--median-len", str(args.median_len), "--max-len", str(args.max_len),
           "--long-len", str(args.long_len), "--dropout", str(args.dropout), "--seed", str(args.seed)]
    return cmd


def child_env(args, spillway_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPILLWAY_")}
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS (torch.use_deterministic_algorithms)
    env["PYTHONHASHSEED"] = "0"
    preload = [p for p in env.get("LD_PRELOAD", "").split() if "libspillway" not in os.path.basename(p)]
    if spillway_env is not None:
        preload.insert(0, os.path.abspath(args.lib))
        env.update(dict(args.settings))
        env.update(spillway_env)
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    else:
        env.pop("LD_PRELOAD", None)
    return env


def run(args, label, spillway_env):
    print(f"bench_gpt: run {label} ...", flush=True)
    log = os.path.join(args.out, "runs", f"{label}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.run(child_cmd(args, label), env=child_env(args, spillway_env),
                              stdout=f, stderr=subprocess.STDOUT)
    path = os.path.join(args.out, "runs", f"{label}.json")
    if proc.returncode != 0 or not os.path.exists(path):
        tail = open(log, errors="replace").read().strip().splitlines()[-5:]
        return {"label": label, "error": f"exit status {proc.returncode}", "log": log, "log_tail": tail}
    with open(path) as f:
        res = json.load(f)
    res["log"] = log
    return res


def compare(args, label):
    import torch
    ref = torch.load(os.path.join(args.out, "runs", "baseline.pt"))
    got = torch.load(os.path.join(args.out, "runs", f"{label}.pt"))
    differ = [k for k in ref if k not in got or not torch.equal(ref[k], got[k])]
    differ += [k for k in got if k not in ref]
    worst = 0.0
    for k in differ:
        if k in ref and k in got and ref[k].shape == got[k].shape:
            worst = max(worst, (ref[k].double() - got[k].double()).abs().max().item())
    return {"tensors": len(ref), "differ": len(differ), "first_differing": differ[:5], "max_abs_diff": worst}


def summarize(res, warmup):
    t = res.get("step_times_s") or []
    kept = t[warmup:] or t
    s = res.get("spillway_stats") or {}
    row = {"run": res["label"], "ok": "error" not in res,
           "median_step_ms": round(statistics.median(kept) * 1e3, 2) if kept else None}
    if s:
        row.update(budget_bytes=s.get("budget_bytes"), peak_bytes=s.get("peak_resident_bytes"),
                   peak_live_bytes=s.get("peak_live_bytes"), bytes_evicted=s.get("bytes_evicted"),
                   bytes_restored=s.get("bytes_restored"), blocks_evicted=s.get("blocks_evicted"),
                   ooms=s.get("ooms"), blind=s.get("blind"), steps_marked=s.get("steps"))
    elif "peak_allocated_bytes" in res:
        row.update(peak_bytes=res["peak_reserved_bytes"], peak_live_bytes=res["peak_allocated_bytes"])
    return row


def gib(v):
    return "-" if v is None else f"{v / 2**30:.2f}"


def markdown(rows, meta):
    lines = [f"# bench_gpt: {meta['device_name']}, {meta['steps']} steps, torch {meta['torch']}", "",
             "Peak: device memory held (baseline: `max_memory_reserved`; spillway: "
             "`peak_resident_bytes`); live: `max_memory_allocated` / `peak_live_bytes`. "
             "Step time: median over the steps after the warm-up, measured wall time. "
             f"Budgets: percentages of the {meta.get('budgets_percent_of')} run's peak "
             f"({gib(meta.get('reference_peak_bytes'))} GiB).", "",
             "| run | budget GiB | peak GiB | peak live GiB | median step ms | vs baseline | "
             "evicted GiB | restored GiB | OOM | bitwise equal to baseline |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = next((r["median_step_ms"] for r in rows if r["run"] == "baseline"), None)
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['run']} | {gib(r.get('budget_bytes'))} | failed: {r.get('error')} "
                         "| | | | | | | |")
            continue
        cmp_ = r.get("comparison")
        eq = "(reference)" if r["run"] == "baseline" else (
            "**yes**" if cmp_ and cmp_["differ"] == 0 else
            f"**NO**: {cmp_['differ']} of {cmp_['tensors']} tensors differ" if cmp_ else "-")
        ratio = f"{r['median_step_ms'] / base:.2f}x" if base and r["median_step_ms"] else "-"
        lines.append(f"| {r['run']} | {gib(r.get('budget_bytes')) if r.get('budget_bytes') else '-'} | "
                     f"{gib(r.get('peak_bytes'))} | {gib(r.get('peak_live_bytes'))} | {r['median_step_ms']} | "
                     f"{ratio} | {gib(r.get('bytes_evicted'))} | {gib(r.get('bytes_restored'))} | "
                     f"{r.get('ooms', '-')} | {eq} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return run_child(args)
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")  # cheaper than importing torch to find there is no driver
    except OSError as e:
        print(f"bench_gpt: no GPU: cannot load libcuda.so.1 ({e}). Nothing was run (exit status 2).",
              file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("bench_gpt: torch is not importable", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_gpt: no GPU: torch.cuda.is_available() is False. Nothing was run (exit status 2).",
              file=sys.stderr)
        return 2
    if not os.path.exists(args.lib):
        print(f"bench_gpt: {args.lib} not found: build spillway first (cmake --build build)", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    results = [run(args, "baseline", None)]
    if "error" in results[0]:
        print(f"bench_gpt: the baseline failed ({results[0]['error']}); see {results[0]['log']}", file=sys.stderr)
    off = run(args, "spillway-off", {"SPILLWAY_MODE": "off"})
    results.append(off)
    if args.budget_of == "baseline":
        peak = results[0].get("peak_reserved_bytes")
    else:
        peak = (off.get("spillway_stats") or {}).get("peak_resident_bytes")
    if not peak:
        print(f"bench_gpt: the {args.budget_of} run gave no peak; budgets not run", file=sys.stderr)
    else:
        for label, env in budget_runs(args, peak):
            results.append(run(args, label, env))
    rows = []
    ok = all("error" not in r for r in results)
    for res in results:
        row = summarize(res, args.warmup)
        if "error" in res:
            row["error"] = res["error"]
        elif res["label"] != "baseline" and "error" not in results[0]:
            row["comparison"] = compare(args, res["label"])
            ok = ok and row["comparison"]["differ"] == 0
        rows.append(row)
    meta = {"steps": args.steps, "budgets_percent_of": args.budget_of, "budgets_percent": args.budgets,
            "reference_peak_bytes": peak, "device": args.device,
            "device_name": results[0].get("device_name", args.device), "torch": torch.__version__,
            "model": {k: getattr(args, k) for k in ("batch", "vocab", "d", "layers", "heads", "median_len",
                                                      "max_len", "long_len", "dropout", "seed")},
            "sequence_lengths": results[0].get("sequence_lengths"), "lib": os.path.abspath(args.lib),
            "settings": dict(args.settings), "variants": [f"{n}={v}" for n, v in args.variants],
            "repeat": args.repeat}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "runs": results}, f, indent=2)
    md = markdown(rows, meta)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    print(md)
    print(f"bench_gpt: {os.path.join(args.out, 'results.md')}, {os.path.join(args.out, 'results.json')}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
