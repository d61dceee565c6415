#!/bin/sh
# docker/runtime-packages.sh: print the Debian/Ubuntu packages that own the
# shared libraries the given programs load (ldd), one per line, sorted.
# The image builds run it in the build stage and install exactly that list
# in the runtime stage, so the runtime image carries only what the binaries
# need and package names never have to be written twice per distribution.
#
#   docker/runtime-packages.sh build/bin/ballastd build/bin/ballast > pkgs.txt
#
# Exits 1 naming any library that no package owns (the runtime stage could
# not provide it) or any program whose libraries do not all resolve.
set -eu
[ $# -gt 0 ] || { echo "usage: $0 PROGRAM..." >&2; exit 2; }
libs=$(mktemp)
trap 'rm -f "$libs"' EXIT
for prog in "$@"; do
    [ -x "$prog" ] || { echo "runtime-packages: $prog is not an executable" >&2; exit 1; }
    if ldd "$prog" | grep -q 'not found'; then
        echo "runtime-packages: $prog: unresolved libraries:" >&2
        ldd "$prog" | grep 'not found' >&2
        exit 1
    fi
    ldd "$prog" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' >> "$libs"
done
for lib in $(sort -u "$libs"); do
    real=$(readlink -f "$lib")
    pkg=""
    # usrmerge: dpkg may know the file under /usr or under the /lib alias.
    for cand in "$lib" "$real" "/usr$lib" "/usr$real" "${lib#/usr}" "${real#/usr}"; do
        pkg=$(dpkg-query -S "$cand" 2>/dev/null | grep -v '^diversion' | head -1 | cut -d: -f1) || true
        [ -n "$pkg" ] && break
    done
    [ -n "$pkg" ] || { echo "runtime-packages: no package owns $lib ($real)" >&2; exit 1; }
    echo "$pkg"
done | sort -u
