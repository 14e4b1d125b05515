#!/usr/bin/env bash
# Installs CRIU >= 4.2 for Ferry (run as root). setup.sh calls it; it also runs alone.
#
# Debian 12 ships CRIU 3.17, which fails on kernels >= 6.13, and Debian 13 ships 4.1, which cannot
# dump a TCP or UDP socket on kernels >= 6.16 (criu #2705). So unless apt offers >= 4.2, this builds
# the upstream tarball that Debian's source archive serves for unstable.
#
# Environment (defaults in brackets):
#   FERRY_CRIU_SRC     where the source is downloaded and built [/usr/local/src/ferry-criu]
#   FERRY_CRIU_PREFIX  where `criu` is installed, as PREFIX/sbin/criu [/usr/local]
#   FERRY_CRIU_BUILD=1 build from source even when a good CRIU is already on PATH or in apt
#
# Every failure prints one line that says what failed and what to do, and exits non-zero.
set -Eeuo pipefail
shopt -s nullglob
on_error() {  # a command that failed without its own message: one line saying where
    local rc=$?
    printf 'setup: installing CRIU failed (exit %s at line %s of scripts/install-criu.sh): fix what the lines above say and run again\n' "$rc" "$1" >&2
    exit "$rc"
}
trap 'on_error $LINENO' ERR

CRIU_MIN=4.2
SRC=${FERRY_CRIU_SRC:-/usr/local/src/ferry-criu}
PREFIX=${FERRY_CRIU_PREFIX:-/usr/local}
FORCE=${FERRY_CRIU_BUILD:-0}
APT_SOURCE=/etc/apt/sources.list.d/ferry-criu-src.sources
BUILD_DEPS=(build-essential dpkg-dev pkg-config libbsd-dev libcap-dev libgnutls28-dev libnet1-dev
    libnftables-dev libnl-3-dev libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler
    python3-protobuf uuid-dev libaio-dev xz-utils)

say() { printf '\033[1msetup:\033[0m %s\n' "$*"; }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
criu_version() { "$1" --version 2>/dev/null | awk '/^Version:/ {print $2}'; }
good_criu() { local v; v=$(criu_version "$1") && [ -n "$v" ] && version_ge "$v" "$CRIU_MIN"; }

export DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes
apt_update() { apt-get update -qq || die "apt-get update failed: check the machine's Debian mirrors in /etc/apt and run again"; }

ensure_deb_src() {
    # apt-get source needs a deb-src entry for unstable; binary packages keep coming from the
    # machine's own release (Types: deb-src only).
    rm -f /etc/apt/sources.list.d/ferry-trixie-src.sources  # an older setup's name for it
    if [ ! -f "$APT_SOURCE" ]; then
        say "adding Debian unstable's source index ($APT_SOURCE)"
        cat > "$APT_SOURCE" <<'SRC'
# Added by Ferry's setup to download CRIU's source (deb-src only: no binary comes from here).
# Remove this file and run `apt-get update` to undo.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    fi
}

install_build_deps() {
    local missing=() p
    for p in "${BUILD_DEPS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} = 0 ] && return 0
    say "installing CRIU's build dependencies: ${missing[*]}"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || die "could not install CRIU's build dependencies (${missing[*]}): see apt's message above"
}

newest_tarball() {  # prints the newest criu_X.orig.tar.* in the current folder whose X >= CRIU_MIN
    local t v best="" bestv=""
    for t in criu_*.orig.tar.*; do
        v=${t#criu_}; v=${v%%.orig.tar.*}
        version_ge "$v" "$CRIU_MIN" || continue
        if [ -z "$bestv" ] || version_ge "$v" "$bestv"; then best=$t; bestv=$v; fi
    done
    printf '%s' "$best"
}

tarball_ok() {  # the tarball's sha256 is the one Debian's source index lists for it
    local want
    want=$(apt-cache showsrc criu 2>/dev/null | awk -v f="$1" '/^Checksums-Sha256:/ {on=1; next} /^[^ ]/ {on=0} on && $3 == f {print $1; exit}')
    [ -n "$want" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$want" ]
}

build_criu() {
    say "building CRIU from Debian unstable's source package in $SRC (a minute or two)"
    ensure_deb_src
    apt_update
    install_build_deps
    mkdir -p "$SRC" || die "cannot create $SRC: set FERRY_CRIU_SRC to a writable folder"
    cd "$SRC"
    local tarball
    tarball=$(newest_tarball)
    if [ -n "$tarball" ] && ! tarball_ok "$tarball"; then
        say "$tarball is not the source Debian lists now: downloading it again"
        rm -f criu_*; tarball=""
    fi
    if [ -z "$tarball" ]; then
        say "downloading CRIU's source (apt-get source criu)"
        # Only the upstream tarball is needed; a mirror that lacks Debian's packaging tarball makes
        # apt-get fail after fetching it, so the result is judged by the tarball and its checksum.
        apt-get source --download-only -qq criu >download.log 2>&1 || true
        tarball=$(newest_tarball)
        if [ -z "$tarball" ]; then
            tail -5 download.log >&2
            die "could not download CRIU >= $CRIU_MIN's source from Debian (log: $SRC/download.log): check access to deb.debian.org and $APT_SOURCE"
        fi
        tarball_ok "$tarball" || { rm -f "$tarball"; die "the downloaded $tarball does not match Debian's checksum (removed): run again"; }
    fi
    say "compiling $tarball"
    rm -rf build && mkdir build
    tar -xf "$tarball" -C build --strip-components=1 || die "cannot unpack $SRC/$tarball: delete it and run again"
    make -C build -j"$(nproc)" criu >build.log 2>&1 \
        || { tail -20 build.log >&2; die "CRIU build failed (log: $SRC/build.log)"; }
    make -C build install-criu PREFIX="$PREFIX" >>build.log 2>&1 \
        || { tail -20 build.log >&2; die "CRIU install into $PREFIX failed (log: $SRC/build.log)"; }
    good_criu "$PREFIX/sbin/criu" || die "the CRIU just built ($PREFIX/sbin/criu) does not run (log: $SRC/build.log)"
}

main() {
    [ "$(id -u)" = 0 ] || die "run as root: CRIU is installed system-wide and needs root to run"
    if [ "$FORCE" != 1 ]; then
        local have
        have=$(command -v criu || true)
        if [ -n "$have" ] && good_criu "$have"; then say "CRIU $(criu_version "$have") is there ($have)"; return; fi
        apt_update
        local cand
        cand=$(apt-cache policy criu 2>/dev/null | awk '/Candidate:/ {print $2}')
        if [ -n "$cand" ] && [ "$cand" != "(none)" ] && version_ge "${cand%%-*}" "$CRIU_MIN"; then
            say "installing CRIU $cand from apt"
            apt-get install -y -qq criu >/dev/null || die "apt-get install criu failed: see apt's message above"
            good_criu "$(command -v criu)" || die "apt's CRIU $cand does not run: see \`criu --version\`"
            return
        fi
    fi
    build_criu
    say "CRIU $(criu_version "$PREFIX/sbin/criu") installed as $PREFIX/sbin/criu"
}

main "$@"
