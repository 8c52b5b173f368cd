"""bench.all_to_all_cuda.ratios: tools/torch_ata_bench.py --device cuda and tools/ata_ratios.py,
as scripts/device_checks.sh's bench part runs them, on this machine (no GPU): Torch AtA skips
every EP size and says why, and the merged JSON has a row per (EP, tokens, op) of pmoe-bench's
emulated run, with each baseline's reason where it holds no time.
    check_ata_ratios.py PMOE_JSON SCRATCH_DIR
"""
import json
import os
import subprocess
import sys

pmoe_json, scratch = sys.argv[1], sys.argv[2]
tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
os.makedirs(scratch, exist_ok=True)
with open(pmoe_json) as f:
    pmoe = json.load(f)
configs = sorted({(r["ranks"], r["tokens"]) for r in pmoe["rows"]})
eps = ",".join(str(w) for w in sorted({w for w, _ in configs}))
tokens = ",".join(str(t) for t in sorted({t for _, t in configs}))
torch_out = os.path.join(scratch, "torch_ata_cuda")
subprocess.run([sys.executable, os.path.join(tools, "torch_ata_bench.py"), "--device", "cuda",
                "--ep", eps, "--tokens", tokens, "--out", torch_out], check=True)
ratios_out = os.path.join(scratch, "all_to_all_ratios.json")
subprocess.run([sys.executable, os.path.join(tools, "ata_ratios.py"), "--pmoe", pmoe_json,
                "--torch", torch_out + ".json", "--out", ratios_out], check=True)
with open(ratios_out) as f:
    rows = json.load(f)["rows"]

failures = []
if len(rows) != 3 * len(configs):
    failures.append(f"{len(rows)} rows, expected 3 ops x {len(configs)} configurations")
for r in rows:
    where = f"EP{r['ep']}, {r['tokens']} tokens, {r['op']}"
    if not r["pmoe_us"] or r["pmoe_us"] <= 0:
        failures.append(f"{where}: no pmoe time")
    torch_why = r["not_run"].get("torch_ata", "")
    if r["torch_ata_us"] is not None or f"needs {r['ep']} GPUs" not in torch_why:
        failures.append(f"{where}: Torch AtA should be skipped for want of GPUs, got "
                        f"{r['torch_ata_us']} / '{torch_why}'")
    if r["op"] == "dispatch_combine":
        nccl_why = r["not_run"].get("nccl_alltoallv", "")
        if r["nccl_alltoallv_us"] is not None or "emulated CUDA device has no NCCL" not in nccl_why:
            failures.append(f"{where}: the NCCL row should say the emulated device has no NCCL, "
                            f"got {r['nccl_alltoallv_us']} / '{nccl_why}'")
        if r["nccl_alltoallv_over_pmoe"] is not None:
            failures.append(f"{where}: a ratio without a time")
for failure in failures:
    print("FAIL:", failure)
if failures:
    sys.exit(1)
print(f"{len(rows)} rows, each baseline's reason given")
