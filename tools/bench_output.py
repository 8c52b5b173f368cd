"""What the Python benchmark tools share: where a run happened (machine, load, commit), which
every results table names, and how they hand over their results: the markdown table on stdout
and, given --out OUT, OUT.json (the whole document) and OUT.md (the table)."""
import json
import os
import platform
import subprocess


def machine(cuda):
    """The CPU model, cores, host and Python; with cuda, the GPUs torch sees ("gpu": a line,
    "none" where it sees none)."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    gpu = "none"
    if cuda:  # --device cuda also runs where torch has no GPU (the skipped rows say so)
        import torch
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            gpu = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return {"cpu": model, "cores": os.cpu_count(), "gpu": gpu, "host": platform.node(),
            "python": platform.python_version()}


def load_average():
    """The 1, 5 and 15 minute load averages, as one string."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def git_commit(root):
    """The short commit of the checkout at root ("" outside git)."""
    return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def write_results(doc, text, out):
    print(text)
    if out:
        with open(out + ".json", "w") as f:
            json.dump(doc, f, indent=1)
        with open(out + ".md", "w") as f:
            f.write(text)
