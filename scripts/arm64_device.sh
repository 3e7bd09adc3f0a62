#!/usr/bin/env bash
# An emulated arm64 device for tvm-memplan: arm64 CPython from Debian packages plus the aarch64
# apache-tvm wheel, run under qemu-aarch64, serving TVM RPC under key "arm64-emu".
# Timings from it are meaningless (emulation); correctness is real.
#
#   scripts/arm64_device.sh prepare                 # once: download into $TVM_MEMPLAN_ARM64_ROOT
#   scripts/arm64_device.sh start --tracker 127.0.0.1:9190 [--key arm64-emu] [--lifetime 1800]
#   scripts/arm64_device.sh python -c 'import tvm; print(tvm.__version__)'
#
# Needs: qemu-user (qemu-aarch64), apt-get and dpkg-deb (Debian), python3 -m pip, network to the
# Debian archive and PyPI. Root is not needed: apt runs on a private state directory, so the
# machine's package lists and dpkg architectures stay untouched.
set -euo pipefail

ROOT=${TVM_MEMPLAN_ARM64_ROOT:-$HOME/.cache/tvm_memplan/arm64-device}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REMOTE="$HERE/../tvm_memplan/deploy/remote.py"
PYVER=3.11
TVM_PINS=(apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1)
# The interpreter, its standard library and what TVM's shared libraries link against.
DEB_ROOTS=(python$PYVER-minimal libpython$PYVER-stdlib libstdc++6 libgcc-s1)

die() { echo "arm64_device.sh: $*" >&2; exit 2; }

need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found (Debian: apt-get install $2)"; }

apt_arm64() {  # apt_arm64 apt-get|apt-cache ARGS...
  local tool=$1; shift
  "$tool" -q -o Dir::State="$ROOT/apt/state" -o Dir::State::status="$ROOT/apt/state/status" \
    -o Dir::Cache="$ROOT/apt/cache" -o APT::Architecture=arm64 -o APT::Architectures=arm64 \
    -o Debug::NoLocking=1 -o APT::Sandbox::User=root "$@"
}

prepare() {
  need qemu-aarch64 qemu-user
  need apt-get apt
  need dpkg-deb dpkg
  mkdir -p "$ROOT/apt/state/lists/partial" "$ROOT/apt/cache/archives/partial" "$ROOT/debs" "$ROOT/bin"
  : > "$ROOT/apt/state/status"
  echo "== arm64 package lists (private apt state in $ROOT/apt)"
  apt_arm64 apt-get update >/dev/null
  # Every package the roots depend on, recursively (Pre-Depends and Depends only).
  mapfile -t packages < <(apt_arm64 apt-cache -o APT::Cache::ShowOnlyFirstOr=true \
      --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances \
      depends --recurse "${DEB_ROOTS[@]}" | grep -v '^ ' | grep -v '^<' | sed 's/:arm64$//' | sort -u)
  [ "${#packages[@]}" -gt 5 ] || die "could not resolve the arm64 packages for python$PYVER"
  echo "== downloading ${#packages[@]} arm64 packages"
  (cd "$ROOT/debs" && apt_arm64 apt-get download "${packages[@]}" >/dev/null)
  rm -rf "$ROOT/sysroot"
  mkdir -p "$ROOT/sysroot"
  for deb in "$ROOT"/debs/*.deb; do dpkg-deb -x "$deb" "$ROOT/sysroot"; done
  [ -x "$ROOT/sysroot/usr/bin/python$PYVER" ] || die "python$PYVER missing from the unpacked packages"
  echo "== aarch64 wheels: ${TVM_PINS[*]}"
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location --upgrade \
    --target "$ROOT/site" --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 \
    --platform manylinux2014_aarch64 --python-version $PYVER --implementation cp \
    --abi "cp${PYVER/./}" --abi abi3 --abi none --only-binary=:all: \
    "${TVM_PINS[@]}" numpy ml_dtypes typing_extensions tornado psutil cloudpickle
  # One wrapper is both argv[0] and sys.executable, so TVM's popen workers (sys.executable -m ...)
  # are emulated too: there is no binfmt_misc to do it for us.
  cat > "$ROOT/bin/python3" <<EOF
#!/bin/sh
export PYTHONHOME="$ROOT/sysroot/usr" PYTHONPATH="$ROOT/site" PYTHONDONTWRITEBYTECODE=1
exec qemu-aarch64 -L "$ROOT/sysroot" -0 "\$0" "$ROOT/sysroot/usr/bin/python$PYVER" "\$@"
EOF
  chmod +x "$ROOT/bin/python3"
  echo "== checking: import tvm under qemu-aarch64 (about 15 s)"
  "$ROOT/bin/python3" -c 'import platform, tvm; print("arm64 device ready:", platform.machine(), "tvm", tvm.__version__)'
}

start() {
  local tracker="" key="arm64-emu" lifetime=1800
  while [ $# -gt 0 ]; do
    case "$1" in
      --tracker) tracker=$2; shift 2 ;;
      --key) key=$2; shift 2 ;;
      --lifetime) lifetime=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  [ -n "$tracker" ] || die "start needs --tracker HOST:PORT"
  [ -x "$ROOT/bin/python3" ] || die "no device in $ROOT: run '$0 prepare' first"
  # Under emulation each TVM import takes ~12 s: one thread keeps the host responsive.
  export TVM_NUM_THREADS=${TVM_NUM_THREADS:-1}
  exec "$ROOT/bin/python3" "$REMOTE" server --tracker "$tracker" --key "$key" --host 127.0.0.1 \
    --port 9090 --lifetime "$lifetime" --parent-pid "$PPID"
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  start) shift; start "$@" ;;
  python) shift; [ -x "$ROOT/bin/python3" ] || die "run '$0 prepare' first"; exec "$ROOT/bin/python3" "$@" ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
