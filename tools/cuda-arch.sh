#!/usr/bin/env bash
# Prints the CMAKE_CUDA_ARCHITECTURES value for the GPUs nvidia-smi sees: their compute
# capabilities, with Hopper as 90a (whose image holds hone's wgmma/TMA attention kernels;
# CMake's "native" would say 90 and leave them out). "native" when nvidia-smi says nothing.
caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | sort -u)
if [ -z "$caps" ]; then echo native; exit 0; fi
out=""
for c in $caps; do
  [ "$c" = 90 ] && c=90a
  out="${out:+$out;}$c"
done
echo "$out"
