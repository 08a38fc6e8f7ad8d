#!/usr/bin/env bash
# The machine code (SASS) of hone's CUDA kernels, to see what ptxas made of them.
# Usage: tools/sass.sh OBJECT [KERNEL_SUBSTRING]
#   OBJECT: an object or binary nvcc built, e.g.
#     build/CMakeFiles/hone_lib.dir/src/cuda/hopper_gemm.cu.o
#   Without KERNEL_SUBSTRING: each kernel's instruction count and its ten most frequent opcodes.
#   With it: the SASS of the kernels whose mangled names contain it.
# cuobjdump and nvdisasm come from the CUDA toolkit where it has them, else from the
# `triton` Python package, which carries both (they read nvcc 13's sm_90a objects).
set -euo pipefail
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: tools/sass.sh OBJECT [KERNEL_SUBSTRING]" >&2; exit 2; }
find_tool() {
  local name=$1 dir
  for dir in "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")" /usr/local/cuda/bin; do
    [ -x "$dir/$name" ] && { echo "$dir/$name"; return; }
  done
  dir=$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))' 2>/dev/null) &&
    [ -x "$dir/backends/nvidia/bin/$name" ] && { echo "$dir/backends/nvidia/bin/$name"; return; }
  echo "tools/sass.sh: no $name in the CUDA toolkit or the triton package" >&2
  exit 1
}
cuobjdump=$(find_tool cuobjdump)
nvdisasm=$(find_tool nvdisasm)
object=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && "$cuobjdump" -xelf all "$object" >/dev/null)
shopt -s nullglob
cubins=("$work"/*.cubin)
[ ${#cubins[@]} -gt 0 ] || { echo "tools/sass.sh: no machine code in $1" >&2; exit 1; }
for cubin in "${cubins[@]}"; do "$nvdisasm" -c "$cubin"; done | python3 -c '
import collections, re, sys
want = sys.argv[1] if len(sys.argv) > 1 else None
name, kernels = None, collections.defaultdict(list)
for line in sys.stdin:
    m = re.match(r"^//-+ \.text\.(\S+)", line)
    if m:
        name = m.group(1)
        continue
    m = re.match(r"^\s+/\*[0-9a-f]+\*/\s+(.*?)\s*;?\s*(/\*.*)?$", line)
    if name and m and m.group(1):
        kernels[name].append(m.group(1))
    elif name and re.match(r"^\.L_x_\d+:", line) and want is not None:
        kernels[name].append(line.strip())  # branch targets, in the listing only
for name, code in sorted(kernels.items()):
    if want is None:
        ops = collections.Counter(re.sub(r"^@!?U?P\w+ ", "", c).split()[0].split(".")[0] for c in code)
        print(len(code), name, " ".join(f"{o}:{n}" for o, n in ops.most_common(10)))
    elif want in name:
        print(f"// {name}")
        print("\n".join(code))
' "${@:2}"
