"""Every MoE family of the installed transformers whose experts go through `ep_dispatch_experts`,
on pmoe: a small random model of each (python/tests/hf_models.py), its logits and every
gradient under torchrun on W ranks with ep_implementation="pmoe" against the single-process
model, one torchrun launch per family so that one family's failure cannot stall the next.

    python3 tools/transformers_ep_sweep.py --ranks 2 --out bench/results/NAME
        writes NAME.json and NAME.md: family -> match (and the worst error), or why not

A family is "match" when its logits and gradients agree with the single-process model within
1e-4 of the largest magnitude (f32); "mismatch" names the first tensor that did not, and then
runs transformers' own "all_to_all" on the same model ("mismatch, as all_to_all" when that
differs from the single-process model too, i.e. the distributed model, not pmoe); "not run"
gives the error that stopped it (building the small config, the model, or the run), as
transformers or pmoe said it.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import traceback

from bench_output import git_commit, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "python", "tests")
sys.path.insert(0, TESTS)
sys.path.insert(0, HERE)


def families():
    """The model types whose config (or text config) has an ep_dispatch_experts rule."""
    import warnings

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    found = []
    for model_type in sorted(CONFIG_MAPPING.keys()):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                config = CONFIG_MAPPING[model_type]()
                text = config.get_text_config()
        except Exception:  # a config that cannot be built with defaults has no plan to read
            continue
        plans = [getattr(c, "base_model_ep_plan", None) or {} for c in (config, text)]
        if any("ep_dispatch_experts" in plan.values() for plan in plans):
            found.append(model_type)
    return found


def text_models(names):
    """{family: its text model's family} for the multimodal families in `names` that are no
    causal LM themselves but whose language model is a family of its own in `names`."""
    import warnings

    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    found = {}
    for name in names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = CONFIG_MAPPING[name]()
            text = config.get_text_config()
        causal = type(config) in AutoModelForCausalLM._model_mapping
        if not causal and text.model_type != name and text.model_type in names:
            found[name] = text.model_type
    return found


def worker(args):
    import torch
    import torch.distributed as dist
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    import pmoe.transformers  # noqa: F401
    from hf_models import save_tiny
    from torchrun_transformers import batches, close, distributed, reference
    rank, world = dist.get_rank(), dist.get_world_size()
    result = {"family": args.family}
    stage = "config"
    tmp = tempfile.mkdtemp(prefix="pmoe-sweep-") if rank == 0 else None
    shared = [None, None, None]
    if rank == 0:
        try:
            path = os.path.join(tmp, args.family)
            vocab = save_tiny(path, args.family, num_experts=2 * world).get_text_config().vocab_size
            shared = [path, vocab, None]
        except Exception as error:
            shared = [None, None, f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"]
    dist.broadcast_object_list(shared, src=0)
    path, vocab, failed = shared
    if failed:
        result.update(status="not run", stage=stage, why=failed)
    else:
        try:
            stage = "single-process model"
            all_ids = batches(world, 1, vocab, 7)
            want_logits, want_grads = reference(path, torch.float32, all_ids)
            stage = "pmoe run"
            got_logits, got_grads = distributed(path, torch.float32, all_ids, "pmoe", 1)
            stage = "comparison"
            worst = close("logits", got_logits, want_logits[rank], torch.float32)
            for name, want in want_grads.items():
                if name not in got_grads:
                    raise AssertionError(f"no gradient for {name}")
                worst = max(worst, close(f"grad {name}", got_grads[name], want, torch.float32))
            result.update(status="match", worst=worst, gradients=len(want_grads))
        except AssertionError as error:
            result.update(status="mismatch", stage=stage, why=str(error))
            # Is it pmoe's? transformers' own "all_to_all" on the same model and batches.
            theirs, _ = distributed(path, torch.float32, all_ids, "all_to_all", 1)
            try:
                close("all_to_all logits", theirs, want_logits[rank], torch.float32)
                result["why"] += "; transformers' all_to_all matches"
            except AssertionError as also:
                result.update(status="mismatch, as all_to_all",
                              why=f"{error}; transformers' all_to_all too: {also}")
        except Exception as error:
            result.update(status="not run", stage=stage,
                          why=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
            if args.verbose:
                traceback.print_exc()
    everyone = [None] * world
    dist.all_gather_object(everyone, result)
    if rank == 0:
        worst = next((r for r in everyone if r["status"] != "match"), everyone[0])
        with open(args.worker_out, "w") as f:
            json.dump(worst, f)
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    dist.destroy_process_group()


def markdown(doc):
    counts = {}
    for row in doc["rows"]:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    lines = ["# transformers MoE families on pmoe (ep_implementation=\"pmoe\")", "",
             f"Command: `{doc['command']}`  ",
             f"Commit: {doc['commit']}. Date: {doc['date']}. torch {doc['torch']}, transformers "
             f"{doc['transformers']}. {doc['ranks']} ranks (processes, gloo), CPU, f32.", "",
             "Each family: a small random model of its own config class (hidden 32, 2 layers, "
             f"{2 * doc['ranks']} experts, top-2), logits and every gradient against the "
             "single-process model. " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
             + ".", "",
             "| family | result | worst error / why not |", "|---|---|---|"]
    for row in doc["rows"]:
        if row["status"] == "match":
            detail = f"{row['worst']:.2g} of the largest magnitude, {row['gradients']} gradients"
        else:
            detail = f"{row.get('stage', '')}: {row.get('why', '')}".replace("|", "\\|")
        lines.append(f"| {row['family']} | {row['status']} | {detail} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--families", help="comma-separated; default: every one found")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per family")
    parser.add_argument("--out", help="write OUT.json and OUT.md")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--family", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_out:
        return worker(args)

    import torch
    import transformers
    names = args.families.split(",") if args.families else families()
    text_of = text_models(names)
    rows = []
    for family in names:
        if family in text_of:
            row = {"family": family, "status": "see text model", "stage": "",
                   "why": f"not a causal LM itself; its language model is the {text_of[family]} "
                          "row"}
            print(f"{family}: {row['why']}", flush=True)
            rows.append(row)
            continue
        part = f"/tmp/transformers_ep_sweep.{os.getpid()}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.ranks}", os.path.abspath(__file__), "--family", family,
               "--worker-out", part] + (["--verbose"] if args.verbose else [])
        env = dict(os.environ, OMP_NUM_THREADS="1", PMOE_TIMEOUT_S="60")
        try:
            done = subprocess.run(cmd, env=env, capture_output=not args.verbose, text=True,
                                  timeout=args.timeout)
            if os.path.exists(part):
                with open(part) as f:
                    row = json.load(f)
                os.remove(part)
            else:
                tail = (done.stderr or "").strip().splitlines()[-1:] or ["no output"]
                row = {"family": family, "status": "not run", "stage": "launch",
                       "why": f"exit {done.returncode}: {tail[0][:300]}"}
        except subprocess.TimeoutExpired:
            row = {"family": family, "status": "not run", "stage": "launch",
                   "why": f"no result within {args.timeout} s"}
        print(f"{family}: {row['status']} {row.get('why', '')}", flush=True)
        rows.append(row)
    commit = git_commit(ROOT)
    doc = {"command": "python3 " + " ".join(sys.argv), "commit": commit,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "ranks": args.ranks, "rows": rows}
    write_results(doc, markdown(doc), args.out)


if __name__ == "__main__":
    main()
