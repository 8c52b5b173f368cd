#!/usr/bin/env python3
"""The emulated device's mutation suite (`make mutation`; docs/emulated-device.md).

Each mutant is one small change to the CUDA kernel sources (KERNEL_GLOBS: the AllToAll and
overlap kernels, the device transport's emulated flavour, memory_ops.cuh) of one of the classes
below, found automatically in the source text. For each, a copy of the tree is
rebuilt in a lean build directory (emulated device only, ccache) and the emulated CUDA tests run
(`ctest -L cuda`, both of the suite's schedules, late stores on, stopping at the first failure).
A mutant is killed when a test fails, survives when all pass. Mutants that are equivalent by
construction are listed in EQUIVALENT with the reason, survivors that a GPU would punish but that
nothing here catches yet in KNOWN_GAPS; both are still run, so the table shows what the tests do
with them. The run fails if a survivor is in neither. The table goes to stdout and, with --doc, replaces the one between
the markers in docs/emulated-device.md.

  scripts/mutation.py [--only REGEX] [--list] [--doc docs/emulated-device.md [--merge]] [--build DIR]
"""
import argparse
import datetime
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every kernel source the emulated device compiles (globs, so new files join): the AllToAll,
# overlap, MoE and expert GEMM kernels, the device transport's emulated flavour and the store
# helper. Left out: transport/gin_remote.cuh and gin_ring_check.cu (NCCL GIN: GPU builds only,
# which nothing here runs) and the host-only files (no pattern below matches them anyway).
KERNEL_GLOBS = ["src/cuda/all_to_all/*.cu", "src/cuda/all_to_all/*.cuh", "src/cuda/overlap/*.cu",
                "src/cuda/overlap/*.cuh", "src/cuda/moe/*.cu", "src/cuda/moe/*.cuh",
                "src/cuda/gemm/*.cu", "src/cuda/gemm/*.cuh", "src/cuda/transport/*.cuh",
                "src/cuda/memory_ops.cuh"]
NOT_EMULATED = {"src/cuda/transport/gin_remote.cuh"}
# Every binary `ctest -L cuda` runs. One left unbuilt is no test to ctest (gtest_discover_tests
# registers an unlabelled placeholder), so its tests silently drop out of every mutant's run, as
# test_cuda_moe's, test_cuda_graph's and test_cuda_all_to_all_traffic's did until the MoE kernels
# joined; a plain add_test's (mpi.cuda_remote) fails the unmutated tree instead.
TEST_TARGETS = ["test_cuda_all_to_all", "test_cuda_grid", "test_cuda_device_utils",
                "test_cuda_emulator", "test_cuda_ipc", "test_cuda_overlap", "test_cuda_cublas",
                "test_emulated_ipc", "test_cuda_moe", "test_cuda_graph", "test_cuda_graph_replay",
                "test_cuda_all_to_all_traffic", "test_mpi_cuda_remote", "test_emulated_remote"]


def kernel_files():
    files = set()
    for pattern in KERNEL_GLOBS:
        files.update(os.path.relpath(f, ROOT) for f in glob.glob(os.path.join(ROOT, pattern)))
    return sorted(files - NOT_EMULATED)
BEGIN, END = "<!-- mutation table: begin -->", "<!-- mutation table: end -->"

# A grid- or block-stride loop (the MoE kernels step by grid_step(): gridDim.x * blockDim.x).
STRIDE = r"\+= (?:(?:gridDim\.x|blockDim\.x|stride)\b|grid_step\(\))"

# (class, what the table calls it, pattern, replacement, which lines: a regex the line must match)
OPERATORS = [
    ("barrier", "drop a barrier", r"__syncthreads\(\);", "", None),
    ("fence", "drop a fence", r"__threadfence(?:_system|_block)?\(\);", "", None),
    ("scope", "narrow a fence to block scope", r"__threadfence(?:_system)?\(\)",
     "__threadfence_block()", None),
    ("scope", "narrow a release store's scope to the block", r"thread_scope_(?:system|device)",
     "thread_scope_block", r"atomic_ref<.*>\(\*word\)\.store"),
    ("order", "relax an ordering", r"memory_order_(?:release|acquire|acq_rel|seq_cst)",
     "memory_order_relaxed", None),
    ("bound", "off by one in a stride loop's bound", r"(; \w+ < )([^;&]+?)( &&|;)", r"\1\2 - 1\3",
     STRIDE),
    ("offset", "off by one in a destination offset", r"\+ 1 \+ i\)", "+ i)", None),
    ("stride", "skip in a grid-stride loop", r"\+= gridDim\.x\)", "+= 2 * gridDim.x)", None),
    ("stride", "skip in a grid-stride loop", r"\+= stride\)", "+= 2 * stride)", r"gridDim|stride\)"),
    ("stride", "skip in a grid-stride loop", r"\+= grid_step\(\)\)", "+= 2 * grid_step())", None),
    # The copy comes out right on x86 and faults on a GPU: caught only by the emulated device's
    # alignment check (src/cuda/emulator/misaligned_access.cpp).
    ("align", "take a 16-byte path at any alignment", r"% 16 (==|!=) 0", r"% 1 \1 0", None),
    # The remote path's rules (gin.h; docs/emulated-device.md, "The remote path"): a flush covers
    # the calling thread's puts only, GIN's signals start anywhere, a signal follows only the puts
    # issued before it.
    ("coop", "a flush by the wrong coop", r"threadIdx\.x == 0\) flush\(", "threadIdx.x == 1) flush(",
     None),
    ("baseline", "a missing baseline", r" - t\.remote_baseline\[slot\]", "", None),
    ("signal", "a signal before its put",
     r"return remote_put\(t\.remote, peer, dst_offset, src_offset, bytes, slot\);",
     "return remote_signal_add(t.remote, peer, slot) && "
     "remote_put(t.remote, peer, dst_offset, src_offset, bytes, -1);", None),
]

# Mutants that cannot change what any kernel does, by (file, classes, text of the mutated line and
# the one after it): why.
FENCE_PRECEDES = ("every signal_release in the kernels follows a __threadfence() or "
                  "__threadfence_system() by the same thread, and a fence then a relaxed store is "
                  "a release (PTX); a relaxed signal with no fence before it is what "
                  "test_cuda_emulator's late-store test shows failing")
EQUIVALENT = {
    # Not the fences before the last blocks' signal loops (dispatch.cu, combine.cu): a remote
    # destination's put_signal may come before any signal_release in the loop, and the put reads
    # what the fence released (they were listed here until a Nodes run killed one).
    ("device_utils.cuh", ("order",), "value, ::cuda::memory_order_release);"): FENCE_PRECEDES,
    ("device_utils.cuh", ("scope",), "(*word).store("): FENCE_PRECEDES,
    ("device_utils.cuh", ("fence", "scope"), "__threadfence_system();\n    // Last: the host"):
        "the error mirror's release store of the code that follows orders the same stores",
    ("device_utils.cuh", ("order",), "HostWord(mirror->code).store(code, ::cuda::memory_order_release)"):
        "a __threadfence_system() precedes it, and a fence then a relaxed store is a release",
    ("device_utils.cuh", ("fence", "scope"), "__threadfence_system();\n  }"):
        "a fence after report()'s last store orders nothing after it that the host reads",
    ("combine.cu", ("barrier",), "__syncthreads();  // next_step, advanced above"):
        "only thread 0 wrote next_step, and only thread 0 reads it in wait_owners",
    ("combine.cu", ("bound",), "h < vector_end - 1"):
        "h runs over multiples of V >= 4 and vector_end is one, so h < vector_end - 1 is "
        "h < vector_end",
    ("node_sum.cuh", ("coop",), "if (threadIdx.x == 1) flush(p.transport);"):
        "a relay's partial block cannot be rewritten before its put has read it: partial out [n] "
        "is rewritten only by the next combine's relay sum, which first waits for the source's "
        "next weights, sent after the source's combine(recv) saw this put's signal (a signal "
        "lands after its put's payload); the flush stays as gin.h's way to free a put's source",
    ("dispatch.cu", ("offset",), "(p.rank + i) % W"):
        "the destinations are visited from the rank itself instead of rank + 1, each still once: "
        "the rotation only spreads the ranks' first writes",
}

# Mutants that change what a GPU does but that neither the emulated device nor the tests catch
# yet, by the same key: why. (The stale-__shared__ `failed` reads of receive_heads and wait_owners
# and the barrier before wait_owners' verdict were here until the emulated device garbage-filled
# __shared__ at each block's start and a test sent expert_y in another dtype from rank 1; the
# reader's side of last_block's fence and of signal_acquire until late stores modelled acquires;
# the host's acquire of the AllToAll error mirror's code (backend.cu) and the release of the
# overlap fault word's peer (signals.cu) until the emulated device kept the order in which the
# host sees host-mapped words, src/cuda/emulator/host_view.hpp; TpMoe's own reader of its fault
# word until it shared the overlap ops' FaultWord, whose reader a test polls; the MoE kernels'
# doubled grid strides until MoeCudaShapes.MoreWorkThanOneGridPass gave their loops more than
# one pass of work; the grouped GEMM's two barriers around a warp's fragment staging until the
# emulated wmma spread an accumulator's elements over the lanes in another order than the one
# the kernel reads them back in.) Reported as survivors; `make mutation` fails on any survivor listed in
# neither table.
KNOWN_GAPS: dict = {
    ("node_sum.cuh", ("barrier",), "__syncthreads();\n  if (failed) return;"):
        "the barrier after a relay's waits for its node's owners: with every wait met, the "
        "barrier after the weights wait that follows also orders the owners' rows before any "
        "read, so only a failed owner wait differs (threads may read `failed` before it is set "
        "and leave at different barriers), which the one test of a relay's failed owner wait "
        "(RelayWithoutASourcesWeightsTimesOutNamingIt, rank 2) gets through on the emulated device",
}


def lookup(table, mutant):
    for (name, classes, needle), reason in table.items():
        if (os.path.basename(mutant["file"]) == name and mutant["class"] in classes
                and (needle in mutant["context"] or needle in mutant["after"])):
            return reason
    return None


def kernel_lines(text):
    """Line numbers (0-based) that hold code, not comments."""
    for i, line in enumerate(text.split("\n")):
        stripped = line.strip()
        if stripped.startswith("//") or stripped.startswith("#"):
            continue
        yield i, line


def find_mutants():
    mutants = []
    for path in kernel_files():
        text = open(os.path.join(ROOT, path)).read()
        lines = text.split("\n")
        for cls, what, pattern, replacement, line_filter in OPERATORS:
            for i, line in kernel_lines(text):
                code = line.split("//")[0]
                if line_filter and not re.search(line_filter, code):
                    continue
                for m in re.finditer(pattern, code):
                    mutated = code[:m.start()] + m.expand(replacement) + code[m.end():]
                    new_lines = lines[:]
                    new_lines[i] = mutated + line[len(code):]
                    mutants.append({
                        "id": f"{cls}@{os.path.basename(path)}:{i + 1}:{m.start()}",
                        "class": cls, "what": what, "file": path, "line": i + 1,
                        "before": line.strip(), "after": mutated.strip(),
                        "text": "\n".join(new_lines),
                        "context": "\n".join(lines[i:i + 2]).strip(),
                    })
    return mutants


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def copy_tree(dest):
    files = run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT).stdout.split("\n")
    for f in files:
        if not f or f.startswith("build/"):
            continue
        src, dst = os.path.join(ROOT, f), os.path.join(dest, f)
        if not os.path.isfile(src):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not os.path.exists(dst) or open(src, "rb").read() != open(dst, "rb").read():
            shutil.copy2(src, dst)


def remove_left_shm(build):
    """Segments a mutant's killed or hung processes left, named for this build tree (the prefix
    CMakeLists.txt gives it), so that the next mutant starts clean."""
    tag = hashlib.md5(os.path.realpath(build).encode()).hexdigest()[:12]
    for name in glob.glob(f"/dev/shm/pmoe-test-{tag}.*"):
        os.remove(name)


def build_and_test(build):
    remove_left_shm(build)
    b = run(["cmake", "--build", build, "-j2", "--target"] + TEST_TARGETS)
    if b.returncode != 0:
        return "does not compile", b.stdout[-2000:]
    # Without the shared-memory fixture's check: a mutant that hangs a process leaves segments
    # behind, and the check would then be the first failure of every later run.
    t = run(["ctest", "--test-dir", build, "-L", "cuda", "-j2", "--stop-on-failure",
             "--timeout", "60", "--output-on-failure", "-FC", "pmoe_shm"])
    remove_left_shm(build)
    if t.returncode == 0:
        return None, t.stdout
    # The first test that failed, not the fixture that then finds the shared memory it left.
    failed = re.findall(r"Test\s+#\d+: (\S+)[^\n]*?\*\*\*\w+", t.stdout)
    named = [f for f in failed if not f.startswith("shm.")] or failed
    return (named[0] if named else "ctest failed"), t.stdout


def row_key_and_verdict(r):
    m = r["mutant"]
    where = f"`{os.path.basename(m['file'])}:{m['line']}`"
    change = f"`{m['before']}` → `{m['after']}`" if m["after"] else f"`{m['before']}` → (removed)"
    change = change.replace("|", "\\|")
    if r["killer"]:
        verdict = f"`{r['killer']}`"
    else:
        verdict = "**survived**"
    if r["equivalent"]:
        verdict += f" (equivalent: {r['equivalent']})"
    elif r["gap"] and not r["killer"]:
        verdict += f" (known gap: {r['gap']})"
    return f"| {m['what']} | {change} | {where} |", verdict


def summary(verdicts):
    killed = sum(1 for v in verdicts if v.startswith("`"))
    survived = [v for v in verdicts if not v.startswith("`")]
    equivalent = sum(1 for v in survived if "(equivalent:" in v)
    gaps = sum(1 for v in survived if "(known gap:" in v)
    return (f"{len(verdicts)} mutants: {killed} killed, {len(survived)} survived: "
            f"{equivalent} equivalent by construction, {gaps} known gaps, "
            f"{len(survived) - equivalent - gaps} unexplained.")


def table(results, header):
    out = [header, "", "| # | class | mutant | where | killed by |", "| --- | --- | --- | --- | --- |"]
    verdicts = []
    for n, r in enumerate(results, 1):
        key, verdict = row_key_and_verdict(r)
        verdicts.append(verdict)
        out.append(f"| {n} {key} {verdict} |")
    out.append("")
    out.append(summary(verdicts))
    return "\n".join(out)


def row_fields(line):
    """(number, class, mutant text, file name) of a table row, or None."""
    m = re.match(r"^\| (\d+) \| ([^|]+) \| (.*) \| `([^`:]+):\d+` \| .* \|$", line)
    return m and (m.group(1), m.group(2), m.group(3), m.group(4))


def merge_into(table_text, results, note, all_mutants):
    """The table with the rows of `results` replaced, the summary recounted and `note` added under
    the header: for a rerun of a few mutants (--merge). A row is matched by class, mutant and
    place; failing that (its file changed since the table was made), by class, mutant and file
    where that text is unique both in the table and among `all_mutants` (a second
    `__syncthreads();` of the file must not take another's row); failing that, by class and file
    where the table and the rerun have one such mutant each. A mutant found in no row (its source
    is new since the table was made) is added at the end."""
    lines = table_text.split("\n")
    rows = {i: row_fields(line) for i, line in enumerate(lines) if row_fields(line)}

    def same_class_and_file(fields, r):
        return fields[1] == r["mutant"]["what"] and fields[3] == os.path.basename(r["mutant"]["file"])

    def same_text(m, r):
        return (m["what"], m["file"], m["before"], m["after"]) == (
            r["mutant"]["what"], r["mutant"]["file"], r["mutant"]["before"], r["mutant"]["after"])

    replaced = added = 0
    for r in results:
        key, verdict = row_key_and_verdict(r)
        text = key.split(" | ")[1]
        found = [i for i, f in rows.items() if lines[i].startswith(f"| {f[0]} {key} ")]
        if not found and sum(same_text(m, r) for m in all_mutants) == 1:
            found = [i for i, f in rows.items() if same_class_and_file(f, r) and f[2] == text]
            found = found if len(found) == 1 else []
        if not found:
            candidates = [i for i, f in rows.items() if same_class_and_file(f, r)]
            rerun = [q for q in results if same_class_and_file(rows[candidates[0]], q)] if candidates else []
            found = candidates if len(candidates) == 1 and len(rerun) == 1 else []
        if found:
            lines[found[0]] = f"| {rows[found[0]][0]} {key} {verdict} |"
            replaced += 1
        else:
            last = max(rows)
            number = max(int(f[0]) for f in rows.values()) + 1
            lines.insert(last + 1, f"| {number} {key} {verdict} |")
            rows[last + 1] = row_fields(lines[last + 1])
            added += 1
    verdicts = []
    for line in lines:
        m = re.match(r"^\| \d+ \| .* \| `[^`]+:\d+` \| (.*) \|$", line)
        if m:
            verdicts.append(m.group(1))
    out = []
    for line in lines:
        if re.match(r"^\d+ mutants: ", line):
            line = summary(verdicts)
        out.append(line)
    out.insert(1, "")
    out.insert(2, note.format(replaced=replaced, added=added))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "mutation"))
    ap.add_argument("--only", default=None, help="run only mutants whose id matches this regex")
    ap.add_argument("--list", action="store_true", help="list the mutants and stop")
    ap.add_argument("--doc", default=None, help="write the table into this markdown file")
    ap.add_argument("--merge", action="store_true",
                    help="with --doc: replace only the rerun mutants' rows of the table there")
    args = ap.parse_args()

    mutants = all_mutants = find_mutants()
    if args.only:
        mutants = [m for m in mutants if re.search(args.only, m["id"])]
    if args.list:
        for m in mutants:
            print(f"{m['id']:40} {m['before']}  ->  {m['after']}")
        print(f"{len(mutants)} mutants")
        return 0

    tree, build = os.path.join(args.build, "tree"), os.path.join(args.build, "build")
    copy_tree(tree)
    if not os.path.exists(os.path.join(build, "build.ninja")):
        c = run(["cmake", "-S", tree, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 "-DPMOE_CUDA=OFF", "-DPMOE_PYTHON=OFF", "-DPMOE_BUILD_TOOLS=OFF",
                 "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"])
        if c.returncode != 0:
            print(c.stdout)
            return 2
    killer, log = build_and_test(build)
    if killer:
        print(f"the unmutated tree fails ({killer}); fix that first:\n{log[-3000:]}")
        return 2

    commit = run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT).stdout.strip()
    started = time.time()
    results = []
    for n, m in enumerate(mutants, 1):
        path = os.path.join(tree, m["file"])
        original = open(path).read()
        t0 = time.time()
        try:
            with open(path, "w") as f:
                f.write(m["text"])
            killer, log = build_and_test(build)
            os.makedirs(os.path.join(args.build, "logs"), exist_ok=True)
            with open(os.path.join(args.build, "logs", m["id"].replace(":", "_") + ".log"), "w") as f:
                f.write(log)
        finally:
            with open(path, "w") as f:
                f.write(original)
        r = {"mutant": m, "killer": killer, "equivalent": lookup(EQUIVALENT, m),
             "gap": lookup(KNOWN_GAPS, m)}
        results.append(r)
        print(f"[{n}/{len(mutants)}] {m['id']}: {killer or 'SURVIVED'} ({time.time() - t0:.0f} s)",
              flush=True)
    run(["cmake", "--build", build, "-j2", "--target"] + TEST_TARGETS)  # back to the real tree

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (f"Generated by `make mutation` (scripts/mutation.py{' --only ' + args.only if args.only else ''}) "
              f"at commit `{commit}`, {when}, on this 2-core CPU machine: {len(mutants)} mutants in "
              f"{(time.time() - started) / 60:.0f} min; each run of `ctest -L cuda` stops at its "
              f"first failure.")
    text = table(results, header)
    print(text)
    if args.doc:
        doc = open(args.doc).read()
        if BEGIN in doc and END in doc and args.merge:
            old = doc[doc.index(BEGIN) + len(BEGIN):doc.index(END)].strip("\n")
            note = (f"Rerun with `scripts/mutation.py --only '{args.only}' --merge` at commit "
                    f"`{commit}`, {when}: {{replaced}} rows replaced, {{added}} added.")
            merged = merge_into(old, results, note, all_mutants)
            doc = doc[:doc.index(BEGIN) + len(BEGIN)] + "\n" + merged + "\n" + doc[doc.index(END):]
            open(args.doc, "w").write(doc)
        elif BEGIN in doc and END in doc:
            doc = doc[:doc.index(BEGIN) + len(BEGIN)] + "\n" + text + "\n" + doc[doc.index(END):]
            open(args.doc, "w").write(doc)
        else:
            print(f"{args.doc} has no mutation table markers; not written", file=sys.stderr)
    unexplained = [r for r in results if not r["killer"] and not r["equivalent"] and not r["gap"]]
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
