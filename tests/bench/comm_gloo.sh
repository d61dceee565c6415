# comm_gloo.sh: Gloo all-reduce and all-gather bus bandwidth between two
# namespace hosts (tests/multihost/hosts.lib) next to iperf3's TCP
# throughput over the same veth pair and bridge, measured in the same run,
# as ratios. Needs root and iperf3 (Debian); says why when it cannot run.
set -u
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../multihost/hosts.lib"
MIB=${GLOO_BENCH_MIB:-64}
command -v iperf3 >/dev/null || { echo "comm_gloo: skipped: iperf3 not installed (apt-get install iperf3)"; exit 0; }
SH=$(t_tmpdir)
mh_up 2 "$SH" || { echo "comm_gloo: skipped: $MH_WHY"; exit 0; }
mh_bg 0 iperf-s iperf3 -s -1 -p 5201
sleep 1
gbps_tcp=$(mh_exec 1 iperf3 -c "$(mh_ip 0)" -p 5201 -t 3 -f g 2>&1 |
           awk '/receiver/ { for (i = 1; i <= NF; i++) if ($i ~ /bits\/sec/) print $(i-1) * ($i ~ /^G/ ? 1 : $i ~ /^M/ ? 0.001 : 1) }' | tail -1)
mh_wait iperf-s 20
[ -n "$gbps_tcp" ] || { echo "comm_gloo: iperf3 gave no figure"; exit 1; }
PORT=$((20000 + RANDOM % 20000))
mh_bg 0 r0 "$BIN/../tests/bench/comm_gloo" 0 2 "$(mh_ip 0):$PORT" "$MIB"
mh_bg 1 r1 "$BIN/../tests/bench/comm_gloo" 1 2 "$(mh_ip 0):$PORT" "$MIB"
rc0=0; mh_wait r0 300 || rc0=$?
rc1=0; mh_wait r1 300 || rc1=$?
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || { echo "comm_gloo: ranks failed ($rc0, $rc1):"; cat "$MH_LOG/r0.out" "$MH_LOG/r1.out"; exit 1; }
ar=$(awk '/^gloo all_reduce/ { print $3 }' "$MH_LOG/r0.out")
ag=$(awk '/^gloo all_gather/ { print $3 }' "$MH_LOG/r0.out")
tcp=$(awk -v g="$gbps_tcp" 'BEGIN { printf "%.3f", g / 8 }')   # GB/s
echo "iperf3 over the veth pair: $gbps_tcp Gbit/s ($tcp GB/s); Gloo bus bandwidth, 2 hosts, $MIB MiB: all-reduce $ar GB/s, all-gather $ag GB/s"
awk -v a="$ar" -v t="$tcp" 'BEGIN { printf "RATIO gloo all_reduce/iperf3 bandwidth, 2 hosts: %.3f (%.3f vs %.3f GB/s)\n", a / t, a, t }'
awk -v a="$ag" -v t="$tcp" 'BEGIN { printf "RATIO gloo all_gather/iperf3 bandwidth, 2 hosts: %.3f (%.3f vs %.3f GB/s)\n", a / t, a, t }'
