# Sourced by the bench scripts: builds `hone` for this GPU into build-bench (configured once,
# reused by later scripts of the same call), logs into $1. On a device image without
# utf8proc, the .deb files carried in .carry/debs (bench/carry_debs.sh fetches them) are
# unpacked for it. Exits on failure.
build_bench_hone() {
  local logs=$1
  if [ ! -e /usr/include/utf8proc.h ] && ls .carry/debs/*.deb >/dev/null 2>&1; then
    if [ ! -d /tmp/deps/usr ]; then
      for d in .carry/debs/*.deb; do dpkg -x "$d" /tmp/deps; done
      # Their pkg-config files name /usr: point them where they were unpacked.
      sed -i 's|^prefix=/usr$|prefix=/tmp/deps/usr|' /tmp/deps/usr/lib/*/pkgconfig/*.pc
    fi
    # Set on every call: build_bench_variant configures with it after an earlier script
    # (another process) configured build-bench.
    HONE_CMAKE_FLAGS="${HONE_CMAKE_FLAGS:-} -DCMAKE_PREFIX_PATH=/tmp/deps/usr"
  fi
  if [ ! -f build-bench/build.ninja ]; then
    cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$(bash tools/cuda-arch.sh)" \
      ${HONE_CMAKE_FLAGS:-} >"$logs/cmake.log" 2>&1 || { tail -30 "$logs/cmake.log"; exit 1; }
  fi
  ninja -C build-bench hone >"$logs/build.log" 2>&1 || { grep -E "error|Error" "$logs/build.log" | head -40; exit 1; }
}

# A/B builds in one device call: build_bench_variant NAME PATCH LOGS TARGETS... copies this
# tree to /tmp/NAME, applies PATCH there (a path inside the tree, such as a .carry file made
# by `git diff main exp/<branch>`; with REVERSE=-R, reversed, to build the commit before a
# change), configures it as build-bench was and builds TARGETS into /tmp/NAME/build. The log
# goes to LOGS/NAME_build.log; the status is the build's. Call build_bench_hone first (it
# sets HONE_CMAKE_FLAGS), then this in the background beside build-bench's own tests.
build_bench_variant() {
  local name=$1 patch=$2 logs=$3
  shift 3
  rm -rf "/tmp/$name" && mkdir -p "/tmp/$name"
  tar cf - --exclude=./build-bench --exclude=./.git . | tar xf - -C "/tmp/$name"
  ( cd "/tmp/$name" && { git apply ${REVERSE:-} "$patch" || patch -p1 ${REVERSE:-} < "$patch"; } &&
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$(bash tools/cuda-arch.sh)" \
      ${HONE_CMAKE_FLAGS:-} && ninja -C build "$@" ) >"$logs/${name}_build.log" 2>&1
}
