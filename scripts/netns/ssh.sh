#!/usr/bin/env bash
# An `ssh` for network-namespace hosts (scripts/netns/setup.sh), for
# `shardlm launch --hostfile H --ssh scripts/netns/ssh.sh`: the host name is
# the namespace, and the command runs there as sshd would run it (through
# `sh -c`, stdin and stdout passed through, its exit status returned).
#
#   scripts/netns/ssh.sh [-o OPTION]... [-p PORT] NAMESPACE COMMAND...
#
# Like a real ssh session to a host whose cables are all down, it fails
# (status 255, after 1 s, "Network is unreachable") when no network device of
# the namespace other than lo has a carrier. It execs the command (no process
# of its own stays behind), so killing it kills the remote shell as a dropped
# ssh session would hang it up; the launcher's remote script then stops its
# rank when its stdin closes. Needs root.
set -euo pipefail

while [ $# -gt 0 ]; do
    case "$1" in
    -o | -p | -i | -l) shift 2 ;;
    -*) shift ;;
    *) break ;;
    esac
done
[ $# -ge 2 ] || { echo "ssh.sh: usage: ssh.sh [-o OPTION]... NAMESPACE COMMAND..." >&2; exit 255; }
host="$1"
shift
if ! ip netns list | awk '{print $1}' | grep -qx -- "$host"; then
    echo "ssh: Could not resolve hostname $host: no such network namespace" >&2
    exit 255
fi
# A device with a carrier: `LOWER_UP` among its flags (lo has it too, so skip lo).
if ! ip -n "$host" -o link show | awk -F': ' '$2 !~ /^lo$/ && /LOWER_UP/ {found=1} END {exit !found}'; then
    sleep 1
    echo "ssh: connect to host $host port 22: Network is unreachable" >&2
    exit 255
fi
exec ip netns exec "$host" sh -c "$*"
