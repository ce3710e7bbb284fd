#!/usr/bin/env bash
# Network namespaces as stand-in hosts for shardlm ranks (needs root and iproute2).
#
#   scripts/netns/setup.sh [--prefix P] [--links L] [--plain] [--rate R] [--rates R1,R2,..]
#                          [--burst B] [--latency T] N
#
# Creates namespaces P1..PN (default P = shardlm-ns). Host I has the address
# 10.77.0.I, so rank I-1 of a world can be started with
#   ip netns exec shardlm-nsI env SHARDLM_RANK=$((I-1)) SHARDLM_SIZE=N \
#       SHARDLM_PEERS=10.77.0.1:7000,...,10.77.0.N:7000 SHARDLM_SECRET=s shardlm run ...
#
# Topologies:
#   --links 0 (default)  a switch: namespace Psw holds bridge br0; host I has
#                        eth0 = 10.77.0.I/24 plugged into it.
#   --links L (L >= 1)   "cables": every pair of hosts I < J gets L direct veth
#                        pairs. Cable K is a subnet of its own,
#                        10.(77+K).(16*I+J).0/24, device lKhJ in host I (lKhI in
#                        host J). 10.77.0.I/32 sits on lo and is routed over
#                        cable 1; with L >= 2 and nft available, new TCP
#                        connections to 10.77.0.0/24 are dealt round-robin over
#                        the cables (connection mark -> routing table 100+K) and
#                        the accepting host answers on the cable a connection
#                        came in on, so N striped connections use N cables.
#                        Without nft the route is multipath with layer-4
#                        hashing, and two connections share a cable half the time.
#                        At most 15 hosts.
#   --plain (with --links) only the cables' own addresses: no 10.77.0.I, no
#                        routes beyond the subnets the addresses imply, no
#                        nft; as real hosts joined by cables. Ranks dial cable
#                        addresses (SHARDLM_LINKS); each host's line lists its
#                        cable addresses towards the other hosts.
#
# --rate R puts `tc qdisc ... root tbf rate R burst B latency T` on every data
# device of every host (egress, so both directions of a cable are limited);
# --rates R1,R2,.. gives cable K its own rate RK instead (with --links);
# B defaults to 256kb (smaller buckets make tbf cut GSO packets
# up, which costs CPU) and T to 50ms. netem is not assumed.
#
# Idempotent: whatever exists under the prefix is torn down first
# (scripts/netns/teardown.sh --prefix P). Nothing outside the namespaces is touched.
set -Eeuo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
prefix=shardlm-ns
links=0
plain=0
rate=""
rates=""
burst=256kb
latency=50ms

usage() {
    sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-2}"
}

n=""
while [ $# -gt 0 ]; do
    case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --links) links="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --rates) rates="$2"; shift 2 ;;
    --plain) plain=1; shift ;;
    --burst) burst="$2"; shift 2 ;;
    --latency) latency="$2"; shift 2 ;;
    -h | --help) usage 0 ;;
    -*) echo "setup.sh: unknown option $1" >&2; usage ;;
    *)
        [ -z "$n" ] || { echo "setup.sh: more than one host count" >&2; usage; }
        n="$1"; shift ;;
    esac
done

die() { echo "setup.sh: $*" >&2; exit 1; }
[[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || die "need a host count N >= 1"
[[ "$links" =~ ^[0-9]+$ ]] || die "--links needs a number"
[ "$(id -u)" = 0 ] || die "needs root (ip netns)"
command -v ip >/dev/null || die "ip not found (apt-get install iproute2)"
if [ "$links" -eq 0 ]; then
    [ "$n" -le 200 ] || die "at most 200 hosts"
else
    [ "$n" -le 15 ] || die "at most 15 hosts with --links"
    [ "$links" -le 8 ] || die "at most 8 links per pair"
fi
if [ "$plain" = 1 ] && [ "$links" -eq 0 ]; then die "--plain needs --links L"; fi
if [ -n "$rates" ] && [ "$links" -eq 0 ]; then die "--rates needs --links L"; fi
IFS=, read -r -a cable_rates <<<"$rates"
if [ -n "$rate$rates" ]; then
    command -v tc >/dev/null || die "tc not found (apt-get install iproute2)"
fi

"$here/teardown.sh" --prefix "$prefix" --quiet

# On any failure below, leave nothing half made.
trap 'echo "setup.sh: failed; tearing down $prefix*" >&2; "$here/teardown.sh" --prefix "$prefix" --quiet' ERR

sys() { # sys NS key value: a sysctl inside namespace NS
    ip netns exec "$1" sh -c "echo $3 > /proc/sys/${2//.//}"
}

host() { echo "${prefix}$1"; }

limit() { # limit NS DEV [CABLE]
    local r="$rate"
    if [ -n "${3:-}" ] && [ -n "${cable_rates[$(($3 - 1))]:-}" ]; then r="${cable_rates[$(($3 - 1))]}"; fi
    [ -n "$r" ] || return 0
    tc -n "$1" qdisc replace dev "$2" root tbf rate "$r" burst "$burst" latency "$latency"
}

for i in $(seq 1 "$n"); do
    ns="$(host "$i")"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    sys "$ns" net.ipv4.conf.all.rp_filter 0
    sys "$ns" net.ipv4.conf.default.rp_filter 0
done

if [ "$links" -eq 0 ]; then
    sw="${prefix}sw"
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    for i in $(seq 1 "$n"); do
        ns="$(host "$i")"
        ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$ns"
        ip -n "$sw" link set "p$i" master br0
        ip -n "$sw" link set "p$i" up
        ip -n "$ns" addr add "10.77.0.$i/24" dev eth0
        ip -n "$ns" link set eth0 up
        limit "$ns" eth0
    done
else
    use_nft=0
    if [ "$links" -ge 2 ] && [ "$plain" = 0 ]; then
        if command -v nft >/dev/null; then
            use_nft=1
        else
            echo "setup.sh: nft not found (apt-get install nftables); connections pick cables by hash" >&2
        fi
    fi
    for i in $(seq 1 "$n"); do
        [ "$plain" = 1 ] || ip -n "$(host "$i")" addr add "10.77.0.$i/32" dev lo
    done
    for i in $(seq 1 "$n"); do
        for j in $(seq $((i + 1)) "$n"); do
            for k in $(seq 1 "$links"); do
                net="10.$((77 + k)).$((16 * i + j))"
                a="$(host "$i")" b="$(host "$j")"
                ip -n "$a" link add "l${k}h$j" type veth peer name "l${k}h$i" netns "$b"
                ip -n "$a" addr add "$net.$i/24" dev "l${k}h$j"
                ip -n "$b" addr add "$net.$j/24" dev "l${k}h$i"
                ip -n "$a" link set "l${k}h$j" up
                ip -n "$b" link set "l${k}h$i" up
                limit "$a" "l${k}h$j" "$k"
                limit "$b" "l${k}h$i" "$k"
            done
        done
    done
    for i in $(seq 1 "$n"); do
        [ "$plain" = 0 ] || continue
        ns="$(host "$i")"
        for j in $(seq 1 "$n"); do
            [ "$i" != "$j" ] || continue
            lo=$((i < j ? i : j)) hi=$((i < j ? j : i))
            via() { echo "10.$((77 + $1)).$((16 * lo + hi)).$j"; }
            if [ "$links" -ge 2 ] && [ "$use_nft" = 0 ]; then
                hops=()
                for k in $(seq 1 "$links"); do hops+=(nexthop via "$(via "$k")" dev "l${k}h$j"); done
                ip -n "$ns" route add "10.77.0.$j/32" src "10.77.0.$i" "${hops[@]}"
            else
                ip -n "$ns" route add "10.77.0.$j/32" via "$(via 1)" dev "l1h$j" src "10.77.0.$i"
            fi
            if [ "$use_nft" = 1 ]; then
                for k in $(seq 1 "$links"); do
                    ip -n "$ns" route add "10.77.0.$j/32" via "$(via "$k")" dev "l${k}h$j" src "10.77.0.$i" \
                        table $((100 + k))
                done
            fi
        done
        if [ "$links" -ge 2 ] && [ "$use_nft" = 0 ]; then
            sys "$ns" net.ipv4.fib_multipath_hash_policy 1
        fi
        if [ "$use_nft" = 1 ]; then
            for k in $(seq 1 "$links"); do
                ip -n "$ns" rule add fwmark "$k" table $((100 + k))
            done
            {
                echo "table ip shardlm {"
                echo "  chain pre {"
                echo "    type filter hook prerouting priority mangle; policy accept;"
                for k in $(seq 1 "$links"); do
                    echo "    ct state new ct mark 0 iifname \"l${k}h*\" ct mark set $k"
                done
                echo "  }"
                echo "  chain out {"
                echo "    type route hook output priority mangle; policy accept;"
                echo "    ct state new ct mark 0 ip daddr 10.77.0.0/24 meta l4proto tcp ct mark set numgen inc mod $links offset 1"
                echo "    meta mark set ct mark"
                echo "  }"
                echo "}"
            } | ip netns exec "$ns" nft -f -
        fi
    done
fi

trap - ERR
for i in $(seq 1 "$n"); do
    if [ "$plain" = 1 ]; then
        addrs=()
        for j in $(seq 1 "$n"); do
            [ "$i" != "$j" ] || continue
            lo=$((i < j ? i : j)) hi=$((i < j ? j : i))
            for k in $(seq 1 "$links"); do addrs+=("10.$((77 + k)).$((16 * lo + hi)).$i"); done
        done
        echo "$(host "$i") $(IFS=,; echo "${addrs[*]}")"
    else
        echo "$(host "$i") 10.77.0.$i"
    fi
done
