#!/usr/bin/env python3
"""Static checks of what nvcc compiled for pmoe's kernels (docs/gpu.md, "What nvcc made of the
kernels"). No GPU needed: everything is read from the cubins in the library with nvcc's own tools.

  measure LIBRARY --out M.json [--arch sm_90a,sm_80] [--sass-all] [--ptxas]
      cuobjdump --dump-resource-usage: registers, stack frame, local and shared memory of every
      kernel, per architecture; cuobjdump -sass: the global loads and stores of the kernels whose
      budget names vector instructions (--sass-all: of every kernel, for the table's vector
      column); --ptxas: the spill bytes ptxas -v reports for the embedded PTX recompiled for
      sm_90a (the table's spill column; about a minute, so not in make test).
  check M.json --budgets kernel_budgets.txt [--only GLOB]
      holds every kernel (or the budget line GLOB) to its budget; exit 1 naming each kernel and
      what it broke.
  table M.json --budgets kernel_budgets.txt
      the markdown table of docs/gpu.md.
  driver BINARY M.json --budgets kernel_budgets.txt
      on a GPU machine (scripts/device_checks.sh static): the driver's own registers, memory and
      resident blocks per SM for the binary's sm_90a cubins, against M.json and the budgets.

cuobjdump, and the nvdisasm its -sass runs, come from the CUDA toolkit or the
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels (scripts/setup.sh), looked for on PATH,
beside nvcc and in the Python packages' nvidia/*/bin.
"""
import argparse
import fnmatch
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# The per-SM resources of the architectures pmoe is built for (CUDA programming guide, "Technical
# Specifications per Compute Capability"): 64K registers, allocated per warp in units of 256;
# shared memory as the largest carve-out; the runtime keeps 1 KiB of it per block.
ARCHS = {
    "sm_80": {"registers": 65536, "shared": 164 * 1024, "threads": 2048, "blocks": 32},
    "sm_90a": {"registers": 65536, "shared": 228 * 1024, "threads": 2048, "blocks": 32},
}
BLOCK_THREADS = 256            # kBlockThreads, src/cuda/launch.cuh
STATIC_SHARED_LIMIT = 48 * 1024  # what a block may declare as static __shared__
RESERVED_SHARED = 1024         # per block, kept by the runtime (sm_80 on)
DEFAULT_BUDGETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_budgets.txt")


def tool(name):
    found = shutil.which(name)
    if found:
        return found
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.join(os.path.dirname(os.path.realpath(nvcc)), name))
    try:
        import nvidia  # the pip wheels' namespace package: nvidia/cu13/bin/cuobjdump
        for root in nvidia.__path__:
            candidates += glob.glob(os.path.join(root, "*", "bin", name))
    except ImportError:
        pass
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    sys.exit(f"check_kernels.py: no {name} on PATH, beside nvcc or in the nvidia pip wheels "
             "(scripts/setup.sh installs nvidia-cuda-cuobjdump)")


def run(cmd, cwd=None):
    # cuobjdump -sass runs nvdisasm, which it looks for on PATH only.
    env = dict(os.environ)
    if "-sass" in cmd:
        env["PATH"] = os.path.dirname(tool("nvdisasm")) + os.pathsep + env.get("PATH", "")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                       env=env)
    if r.returncode != 0:
        sys.exit(f"check_kernels.py: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return r.stdout


def short_names(mangled):
    """{mangled: name without namespaces and arguments}, e.g. reduce_rows<float, __half>."""
    if not shutil.which("c++filt"):  # the lent GPU machine's image may lack binutils
        return {m: plain_name(m) for m in mangled}
    out = subprocess.run(["c++filt"], input="\n".join(mangled), stdout=subprocess.PIPE,
                         text=True, check=True).stdout
    names = {}
    for m, d in zip(mangled, out.split("\n")):
        d = d.replace("(anonymous namespace)::", "")
        d = re.sub(r"^void ", "", d)
        d = d.split("(")[0]
        head, angle, rest = d.partition("<")
        names[m] = head.split("::")[-1] + angle + rest
    return names


def plain_name(mangled):
    """The last name of a mangled nested name, with <...> for template arguments (enough for the
    budgets' globs): _ZN4pmoe...11reduce_rowsIffEEv... -> reduce_rows<...>."""
    name, i = mangled, 3 if mangled.startswith("_ZN") else len(mangled)
    while i < len(mangled) and mangled[i].isdigit():
        j = i
        while mangled[j].isdigit():
            j += 1
        length = int(mangled[i:j])
        name, i = mangled[j:j + length], j + length
    return name + ("<...>" if mangled[i:i + 1] == "I" else "")


def resource_usage(library, arch):
    """{mangled kernel: {reg, stack, shared, local}} from cuobjdump --dump-resource-usage."""
    text = run([tool("cuobjdump"), "--dump-resource-usage", "-arch", arch, library])
    kernels, current = {}, None
    for line in text.split("\n"):
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            current = m.group(1)
            continue
        m = re.match(r"\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m and current:
            kernels[current] = dict(zip(("registers", "stack", "shared", "local"),
                                        map(int, m.groups())))
            current = None
    return kernels


def global_accesses(library, arch, kernels):
    """{mangled function: {SASS global or local load/store opcode: count}} of the kernels named
    (all when None), from cuobjdump -sass (-fun: only theirs are disassembled)."""
    if kernels is not None and not kernels:
        return {}
    select = ["-fun", ",".join(sorted(kernels))] if kernels is not None else []
    text = run([tool("cuobjdump"), "-sass", "-arch", arch] + select + [library])
    ops, current = {}, None
    for line in text.split("\n"):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            current = ops.setdefault(m.group(1), {})
            continue
        m = re.search(r"\b((?:LDG|STG|LDL|STL)(?:\.[A-Z0-9_]+)*)\s", line)
        if m and current is not None:
            current[m.group(1)] = current.get(m.group(1), 0) + 1
    return ops


def ptxas_spills(library):
    """{mangled kernel: spill store bytes} from ptxas -v on the library's PTX, built for sm_90a."""
    spills = {}
    with tempfile.TemporaryDirectory() as scratch:
        run([tool("cuobjdump"), "-xptx", "all", os.path.abspath(library)], cwd=scratch)
        for ptx in sorted(glob.glob(os.path.join(scratch, "*.ptx"))):
            r = subprocess.run([tool("ptxas"), "-arch=sm_90a", "-v", ptx, "-o", os.devnull],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            name = None
            for line in r.stdout.split("\n"):
                m = re.search(r"Function properties for (\S+)", line)
                if m:
                    name = m.group(1)
                m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
                if m and name:
                    spills[name] = max(int(m.group(1)), int(m.group(2)))
                    name = None
    return spills


def read_budgets(path):
    budgets = []
    for line in open(path):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0].isspace():  # the why of the entry above, continued
            if not budgets:
                sys.exit(f"{path}: '{line.strip()}' continues no entry")
            budgets[-1]["why"] += " " + line.strip()
            continue
        fields = line.split(None, 4)
        if len(fields) < 4:
            sys.exit(f"{path}: '{line.strip()}' needs kernel, blocks, local, vector[, why]")
        kernel, blocks, local, vector = fields[:4]
        why = fields[4].strip() if len(fields) > 4 else "-"
        if int(local) and why == "-":
            sys.exit(f"{path}: {kernel} may use {local} bytes of local memory: say why")
        budgets.append({"kernel": kernel, "blocks": int(blocks), "local": int(local),
                        "vector": [] if vector == "-" else vector.split(","), "why": why})
    return budgets


def budget_for(name, budgets):
    return next(b for b in budgets if fnmatch.fnmatchcase(name, b["kernel"]))


def register_budget(blocks, arch):
    """The most registers a thread may have for `blocks` blocks of 256 threads on one SM."""
    per_block = ARCHS[arch]["registers"] // blocks
    return min(255, per_block // BLOCK_THREADS // 8 * 8)


def blocks_per_sm(usage, arch):
    a = ARCHS[arch]
    warps = BLOCK_THREADS // 32
    regs_per_warp = -(-usage["registers"] * 32 // 256) * 256
    by_registers = a["registers"] // (regs_per_warp * warps) if usage["registers"] else a["blocks"]
    shared = -(-usage["shared"] // 128) * 128 + RESERVED_SHARED
    return min(by_registers, a["shared"] // shared, a["threads"] // BLOCK_THREADS, a["blocks"])


def vector_width(ops, kind):
    """The widest global access of `kind` (LDG or STG) in bits, 0 if none."""
    widest = 0
    for op in ops:
        if op.startswith(kind):
            m = re.search(r"\.(128|64|U16|S16|U8|S8)(?:\.|$)", op)
            widest = max(widest, {"128": 128, "64": 64, "U16": 16, "S16": 16, "U8": 8,
                                  "S8": 8}[m.group(1)] if m else 32)
    return widest


def measure(args):
    archs = args.arch.split(",")
    budgets = read_budgets(args.budgets)
    result = {"library": os.path.abspath(args.library), "archs": {}}
    for arch in archs:
        usage = resource_usage(args.library, arch)
        names = short_names(list(usage))
        wanted = set(usage) if args.sass_all else {
            m for m in usage if budget_for(names[m], budgets)["vector"]}
        ops = global_accesses(args.library, arch, None if args.sass_all else wanted)
        result["archs"][arch] = {
            m: dict(usage[m], name=names[m], sass=ops.get(m) if m in wanted else None)
            for m in usage}
    if args.ptxas:
        spills = ptxas_spills(args.library)
        for kernels in result["archs"].values():
            for m, k in kernels.items():
                if m in spills:
                    k["spills_sm_90a"] = spills[m]
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    return 0


def problems(name, arch, k, budget):
    found = []
    limit = register_budget(budget["blocks"], arch)
    if k["registers"] > limit:
        found.append(f"{k['registers']} registers, over the {limit} that {budget['blocks']} "
                     f"blocks of {BLOCK_THREADS} threads per SM allow")
    local = k["stack"] + k["local"]
    if local > budget["local"]:
        found.append(f"{k['stack']} bytes of stack frame and {k['local']} of local memory (spills "
                     f"or local arrays), over the {budget['local']} its budget allows"
                     + ("" if budget["local"] else " (none: say why in kernel_budgets.txt)"))
    if k["shared"] > STATIC_SHARED_LIMIT:
        found.append(f"{k['shared']} bytes of shared memory, over the {STATIC_SHARED_LIMIT} a "
                     "block may declare")
    fit = blocks_per_sm(k, arch)
    if fit < budget["blocks"]:
        found.append(f"{fit} blocks fit on an SM ({k['registers']} registers, {k['shared']} bytes "
                     f"of shared memory), the design counts on {budget['blocks']}")
    for op in budget["vector"]:
        if k["sass"] is None:
            found.append(f"no SASS was read, so {op} could not be checked")
        elif not k["sass"].get(op):
            have = sorted(o for o in k["sass"] if o.startswith(op[:3]))
            found.append(f"no {op} in its SASS: its copy loop is no longer 128-bit "
                         f"({op[:3]} it has: {', '.join(have) or 'none'})")
    return found


def check(args):
    measured = json.load(open(args.measured))
    budgets = read_budgets(args.budgets)
    failures, checked = [], 0
    for line in budgets:
        if args.only and line["kernel"] != args.only:
            continue
        matched = 0
        for arch, kernels in sorted(measured["archs"].items()):
            for k in sorted(kernels.values(), key=lambda k: k["name"]):
                if budget_for(k["name"], budgets) is not line:
                    continue
                matched += 1
                for p in problems(k["name"], arch, k, line):
                    failures.append(f"{k['name']} ({arch}): {p}")
        # A copy-loop kernel that is renamed must not slip out of the vector check; a line with
        # no vector instructions may name a kernel this build leaves out (ring_check: GIN only).
        if line["vector"] and not matched:
            failures.append(f"no kernel matches the budget line '{line['kernel']}' in "
                            f"{measured['library']} (renamed? then rename it in {args.budgets})")
        checked += matched
    for f in failures:
        print(f"FAIL: {f}")
    print(f"{checked} kernel builds checked against {args.budgets}"
          f"{' (' + args.only + ')' if args.only else ''}: {len(failures)} failures")
    return 1 if failures else 0


def table(args):
    measured = json.load(open(args.measured))
    budgets = read_budgets(args.budgets)
    archs = sorted(measured["archs"], reverse=True)  # sm_90a first
    rows = {}
    for arch in archs:
        for k in measured["archs"][arch].values():
            rows.setdefault(k["name"], {})[arch] = k
    both = " / ".join(archs)
    print(f"| kernel | registers ({both}) | shared memory (B) | stack + local (B) "
          f"| spills (B, sm_90a) | vector width, load / store (sm_90a) | blocks per SM: fit "
          f"({both}), expected |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in sorted(rows):
        per = rows[name]
        # Kernels built for one architecture only (the CUTLASS GEMMs: grouped_gemm_sm90.cu,
        # grouped_gemm_sm80.cu) are shown with what that one has.
        first = per[next(a for a in archs if a in per)]
        budget = budget_for(name, budgets)
        sass = first.get("sass")
        width = (f"{vector_width(sass, 'LDG')} / {vector_width(sass, 'STG')}"
                 if sass is not None else "?")
        spills = first.get("spills_sm_90a", "?")
        print(f"| `{name}` | " + " / ".join(str(per[a]["registers"]) for a in archs if a in per)
              + f" | {first['shared']} | " + " / ".join(str(per[a]["stack"] + per[a]["local"])
                                                       for a in archs if a in per)
              + f" | {spills} | {width} | "
              + " / ".join(str(blocks_per_sm(per[a], a)) for a in archs if a in per)
              + f", {budget['blocks']} |")
    return 0


def driver(args):
    """The driver's own view of the binary's sm_90a cubins on this machine's GPU: each kernel's
    registers, local and shared bytes (cuFuncGetAttribute) and the blocks of 256 threads it keeps
    resident on an SM (cuOccupancyMaxActiveBlocksPerMultiprocessor), against the static measure
    of the same binary (M.json) and the budgets. Needs a GPU (libcuda)."""
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    ptr, cint, cuint = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint

    def call(name, *arguments):
        result = getattr(cuda, name)(*arguments)
        if result != 0:
            raise RuntimeError(f"{name} returned CUresult {result}")

    call("cuInit", 0)
    device, context = cint(), ptr()
    call("cuDeviceGet", ctypes.byref(device), 0)
    call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
    call("cuCtxSetCurrent", context)
    name_buffer = ctypes.create_string_buffer(256)
    call("cuDeviceGetName", name_buffer, 256, device)
    measured = json.load(open(args.measured))["archs"]["sm_90a"]
    budgets = read_budgets(args.budgets)
    seen, failures = {}, []
    with tempfile.TemporaryDirectory() as scratch:
        run([tool("cuobjdump"), "-xelf", "all", os.path.abspath(args.binary)], cwd=scratch)
        for cubin in sorted(glob.glob(os.path.join(scratch, "*sm_90a*.cubin"))):
            module = ptr()
            try:
                call("cuModuleLoad", ctypes.byref(module), cubin.encode())
            except RuntimeError as e:
                print(f"{os.path.basename(cubin)}: not loaded ({e})")
                continue
            count = cuint()
            call("cuModuleGetFunctionCount", ctypes.byref(count), module)
            functions = (ptr * count.value)()
            call("cuModuleEnumerateFunctions", functions, count, module)
            for f in functions:
                f = ptr(f)
                name = ctypes.c_char_p()
                call("cuFuncGetName", ctypes.byref(name), f)
                values = {}
                for key, attribute in (("shared", 1), ("local", 3), ("registers", 4)):
                    v = cint()
                    call("cuFuncGetAttribute", ctypes.byref(v), attribute, f)
                    values[key] = v.value
                blocks = cint()
                call("cuOccupancyMaxActiveBlocksPerMultiprocessor", ctypes.byref(blocks), f,
                     BLOCK_THREADS, ctypes.c_size_t(0))
                values["blocks"] = blocks.value
                seen[name.value.decode()] = values
            call("cuModuleUnload", module)
    print(f"| kernel | registers (static / driver) | local (B) | shared (B) | blocks per SM, "
          f"driver ({name_buffer.value.decode()}) | expected |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mangled, k in sorted(measured.items(), key=lambda item: item[1]["name"]):
        budget = budget_for(k["name"], budgets)
        d = seen.get(mangled)
        if d is None:
            failures.append(f"{k['name']}: the driver did not load it")
            continue
        print(f"| `{k['name']}` | {k['registers']} / {d['registers']} | {d['local']} | "
              f"{d['shared']} | {d['blocks']} | {budget['blocks']} |")
        if d["registers"] != k["registers"]:
            failures.append(f"{k['name']}: the driver counts {d['registers']} registers, "
                            f"cuobjdump {k['registers']}")
        if d["blocks"] < budget["blocks"]:
            failures.append(f"{k['name']}: {d['blocks']} blocks per SM on this GPU, the design "
                            f"counts on {budget['blocks']}")
    for f in failures:
        print(f"FAIL: {f}")
    print(f"{len(measured)} kernels, {len(seen)} loaded by the driver: {len(failures)} failures")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("library")
    m.add_argument("--out", required=True)
    m.add_argument("--budgets", default=DEFAULT_BUDGETS)
    m.add_argument("--arch", default="sm_90a,sm_80")
    m.add_argument("--sass-all", action="store_true")
    m.add_argument("--ptxas", action="store_true")
    for name in ("check", "table"):
        c = sub.add_parser(name)
        c.add_argument("measured")
        c.add_argument("--budgets", default=DEFAULT_BUDGETS)
        if name == "check":
            c.add_argument("--only", help="check only the kernels of this budget line")
    d = sub.add_parser("driver")
    d.add_argument("binary")
    d.add_argument("measured")
    d.add_argument("--budgets", default=DEFAULT_BUDGETS)
    args = ap.parse_args()
    commands = {"measure": measure, "check": check, "table": table, "driver": driver}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
