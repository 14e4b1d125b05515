#!/usr/bin/env bash
# Undoes what ./setup.sh changed outside the repository: the CRIU it built into /usr/local, its
# source folder, and the apt source it added. Debian packages stay (others may use them); the
# command that removes them is printed. The .venv folder in the repository is left too.
set -euo pipefail
SRC=${FERRY_CRIU_SRC:-/usr/local/src/ferry-criu}
PREFIX=${FERRY_CRIU_PREFIX:-/usr/local}
APT_SOURCE=/etc/apt/sources.list.d/ferry-criu-src.sources
say() { printf '\033[1msetup:\033[0m %s\n' "$*"; }
[ "$(id -u)" = 0 ] || { echo "setup: run as root: sudo ./setup.sh --uninstall" >&2; exit 1; }
if [ -f "$SRC/build/Makefile" ]; then
    make -C "$SRC/build" uninstall-criu PREFIX="$PREFIX" >/dev/null 2>&1 || true
fi
for f in "$PREFIX/sbin/criu" "$PREFIX/sbin/criu-ns"; do
    [ -e "$f" ] && { say "removing $f"; rm -f "$f"; }
done
[ -d "$SRC" ] && { say "removing $SRC"; rm -rf "$SRC"; }
if [ -f "$APT_SOURCE" ]; then
    say "removing $APT_SOURCE"; rm -f "$APT_SOURCE"; apt-get update -qq || true
fi
"$(dirname "$0")/install-slurm-plugin.sh" --uninstall
say "fs.pipe-max-size was raised only until the next boot (sysctl -w fs.pipe-max-size=1048576 resets it now)"
say "Debian packages left installed; to remove them:"
echo "  apt-get remove redis-server shellcheck nftables runc containerd umoci busybox-static slurm-wlm slurmctld slurmd munge libslurm-dev $(sed -n '/^BUILD_DEPS=(/,/)/p' "$(dirname "$0")/install-criu.sh" | tr -d '()' | sed 's/BUILD_DEPS=//' | tr -s ' \n' ' ')"
say "the repository's .venv and .tools (Node and OpenClaw) are left: rm -rf .venv .tools"
