#!/usr/bin/env bash
# Removes the namespaces scripts/netns/setup.sh made (P1..PN and Psw).
#
#   scripts/netns/teardown.sh [--prefix P] [--quiet]
#
# Processes still running inside them are sent SIGTERM (then SIGKILL after a
# second), by pid, so the namespaces and their veth devices really go away.
# Deleting a namespace deletes its devices and so the far ends of its veths.
# Safe to run when nothing exists.
set -euo pipefail

prefix=shardlm-ns
quiet=0
while [ $# -gt 0 ]; do
    case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --quiet) quiet=1; shift ;;
    -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "teardown.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -n "$prefix" ] || { echo "teardown.sh: empty prefix" >&2; exit 2; }
command -v ip >/dev/null || { echo "teardown.sh: ip not found" >&2; exit 1; }

names=()
while read -r name _; do
    rest="${name#"$prefix"}"
    [ "$rest" != "$name" ] || continue
    if [[ "$rest" =~ ^[0-9]+$ ]] || [ "$rest" = sw ]; then
        names+=("$name")
    fi
done < <(ip netns list 2>/dev/null || true)

[ ${#names[@]} -gt 0 ] || exit 0

pids=()
for ns in "${names[@]}"; do
    while read -r pid; do
        [ -n "$pid" ] && pids+=("$pid")
    done < <(ip netns pids "$ns" 2>/dev/null || true)
done
if [ ${#pids[@]} -gt 0 ]; then
    [ "$quiet" = 1 ] || echo "teardown.sh: stopping pids ${pids[*]}" >&2
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 1 10); do
        alive=()
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
        [ ${#alive[@]} -gt 0 ] || break
        sleep 0.1
    done
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
fi

for ns in "${names[@]}"; do
    ip netns del "$ns" 2>/dev/null || true
    [ "$quiet" = 1 ] || echo "removed $ns"
done
