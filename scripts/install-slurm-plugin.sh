#!/usr/bin/env bash
# Builds Ferry's SPANK plugin (deploy/slurm/ferry_spank.c) against the installed SLURM's headers,
# installs it into SLURM's plugin folder and names it in plugstack.conf.d/ferry.conf, which
# Debian's plugstack.conf includes (run as root). setup.sh
# calls it after installing slurm-wlm, munge and libslurm-dev; it also runs alone.
#
#   scripts/install-slurm-plugin.sh             build, check, install
#   scripts/install-slurm-plugin.sh --uninstall remove the plugin and its plugstack.conf line
#
# Environment (defaults in brackets):
#   FERRY_SLURM_PLUGIN_DIR  SLURM's plugin folder [/usr/lib/<multiarch>/slurm-wlm]
#   FERRY_SLURM_PLUGSTACK   the plugstack.conf SLURM reads [/etc/slurm/plugstack.conf]; the
#                           plugin's line goes to ferry.conf in its plugstack.conf.d folder, and
#                           an include line is added to it when it has none for that file
#   FERRY_SLURM_LAUNCHER    what a --ferry task runs [<repository>/.venv/bin/ferry-slurm-task]
#   FERRY_SLURM_HEADER      the slurm_version.h whose version is checked against slurmd's
#                           [/usr/include/slurm/slurm_version.h]
#
# The plugstack.conf line says `optional`: a node where the plugin cannot load still runs jobs.
# Every failure prints one line that says what failed and what to do, and exits non-zero.
set -Eeuo pipefail
on_error() {
    local rc=$?
    printf 'setup: installing the SLURM plugin failed (exit %s at line %s of scripts/install-slurm-plugin.sh): fix what the lines above say and run again\n' "$rc" "$1" >&2
    exit "$rc"
}
trap 'on_error $LINENO' ERR
cd "$(dirname "$(readlink -f "$0")")/.."
say() { printf '\033[1msetup:\033[0m %s\n' "$*"; }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }

MULTIARCH=$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
PLUGIN_DIR=${FERRY_SLURM_PLUGIN_DIR:-/usr/lib/$MULTIARCH/slurm-wlm}
PLUGSTACK=${FERRY_SLURM_PLUGSTACK:-/etc/slurm/plugstack.conf}
LAUNCHER=${FERRY_SLURM_LAUNCHER:-$PWD/.venv/bin/ferry-slurm-task}
HEADER=${FERRY_SLURM_HEADER:-/usr/include/slurm/slurm_version.h}
BUILT=build/slurm/ferry_spank.so
INSTALLED=$PLUGIN_DIR/ferry_spank.so
OURS=$(dirname "$PLUGSTACK")/plugstack.conf.d/ferry.conf
INCLUDE="include $OURS"

if [ "${1:-}" = --uninstall ]; then
    for f in "$INSTALLED" "$OURS"; do
        [ -e "$f" ] && { say "removing $f"; rm -f "$f"; }
    done
    if [ -f "$PLUGSTACK" ] && grep -qxF "$INCLUDE" "$PLUGSTACK"; then  # the line this script added
        say "removing '$INCLUDE' from $PLUGSTACK"
        grep -vxF "$INCLUDE" "$PLUGSTACK" > "$PLUGSTACK.ferry-tmp" || true
        cat "$PLUGSTACK.ferry-tmp" > "$PLUGSTACK" && rm -f "$PLUGSTACK.ferry-tmp"
    fi
    exit 0
fi

[ -f "$HEADER" ] || die "$HEADER not found: install libslurm-dev (SLURM's headers)"
[ -d "$PLUGIN_DIR" ] || die "$PLUGIN_DIR not found: install slurm-wlm, or set FERRY_SLURM_PLUGIN_DIR to SLURM's PluginDir"
command -v slurmd >/dev/null || die "slurmd not found: install slurmd (Debian package slurmd)"

# The plugin is built for the headers' version; slurmd loads only plugins of its own major.minor.
hex=$(awk '/#define SLURM_VERSION_NUMBER/ {print $3}' "$HEADER")
headers=$(printf '%d.%02d.%d' $(( (hex >> 16) & 0xff )) $(( (hex >> 8) & 0xff )) $(( hex & 0xff )))
daemons=$(slurmd -V | awk '{print $2}')
if [ "${headers%.*}" != "$(echo "$daemons" | cut -d. -f1-2)" ]; then
    die "SLURM version mismatch: the headers (libslurm-dev) are $headers but slurmd is $daemons; install libslurm-dev of slurmd's version and run again"
fi

mkdir -p "$(dirname "$BUILT")"
if [ ! -f "$BUILT" ] || [ deploy/slurm/ferry_spank.c -nt "$BUILT" ] || [ "$HEADER" -nt "$BUILT" ]; then
    say "building the SLURM plugin against SLURM $headers"
    gcc -O2 -Wall -Wextra -Werror -fPIC -shared -o "$BUILT.tmp" deploy/slurm/ferry_spank.c \
        || die "the SLURM plugin did not build against SLURM $headers: see gcc's message above"
    mv "$BUILT.tmp" "$BUILT"
fi
if ! cmp -s "$BUILT" "$INSTALLED" 2>/dev/null; then
    say "installing $INSTALLED"
    install -m 0755 "$BUILT" "$INSTALLED"
fi
want="optional $INSTALLED ferry=$LAUNCHER"
if [ "$(cat "$OURS" 2>/dev/null)" != "$want" ]; then
    say "naming the plugin in $OURS"
    mkdir -p "$(dirname "$OURS")"
    echo "$want" > "$OURS"
fi
# Debian's plugstack.conf says `include /etc/slurm/plugstack.conf.d/*.conf`; another may not
if ! grep -qE "^[[:space:]]*include[[:space:]]+($(dirname "$OURS")/\*\.conf|$OURS)[[:space:]]*$" "$PLUGSTACK" 2>/dev/null; then
    say "adding '$INCLUDE' to $PLUGSTACK"
    echo "$INCLUDE" >> "$PLUGSTACK"
fi
