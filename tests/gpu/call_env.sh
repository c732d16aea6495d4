# Sourced by the device-call scripts (tests/gpu/*_call.sh): elapsed-time lines (`el`), OUT, the
# bundle unpacked to /tmp/gb (G) once per machine and bundle, and the environment the binaries need there.
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s] $*"; }
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# Unpacked again where a later call on the same machine carries another bundle (its size differs);
# a call that carries none (another archive in its place) keeps the one unpacked before.
if [ -f .dev/gb.tar.xz ]; then
  stamp=/tmp/gb.unpacked.$(stat -c %s .dev/gb.tar.xz)
  [ -e "$stamp" ] || { rm -rf /tmp/gb /tmp/gb.unpacked.*; tar -xJf .dev/gb.tar.xz -C /tmp && touch "$stamp"; }
fi
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 VOXTILE_REQUIRE_GPU=1 VOXTILE_REQUIRE_NVRTC=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/voxtile-cache}
# The bundle's prebuilt kernel cache (tests/gpu/build.sh), files the machine lacks only.
if [ -d /tmp/gb/cache/voxtile ]; then
  mkdir -p "$XDG_CACHE_HOME/voxtile"
  cp -n /tmp/gb/cache/voxtile/* "$XDG_CACHE_HOME/voxtile/" 2>/dev/null || true
fi
G=/tmp/gb
