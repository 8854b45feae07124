#!/bin/busybox sh
# /init of the svnic test guest (copied into the initramfs by vm-images/build.sh).
#
# Everything it does is chosen on the kernel command line: words of the form KEY=value that the
# kernel does not know reach /init as environment variables (see docs/vm.md).
#
#   IP=10.0.0.1/24       address for eth0 (eth0 is brought up either way)
#   HUGEPAGES=16         reserve that many 2 MiB pages and mount hugetlbfs on /dev/hugepages
#   RUN=step,step,...    what to run, in order (default: shell). Steps:
#     ping:ADDR[:COUNT]       ping ADDR over eth0; ok if COUNT (3) replies come within 30 s
#     echo-server[:PORT]      start a TCP echo server (busybox nc) in the background (port 7)
#     tcp-echo:ADDR[:PORT]    send a token to ADDR's echo server, ok if it comes back (retries 30 s)
#     wait-quit[:PORT[:SECS]] wait for one TCP connection on PORT (9), at most SECS (120)
#     quit:ADDR[:PORT]        connect to ADDR:PORT (9): releases a peer's wait-quit
#     sleep:SECS              sleep
#     cmd:WORD+WORD+...       run a command ('+' stands for a space), e.g. cmd:svnic-guest+--help
#     user:WORD+WORD+...      the same as user nobody (65534; busybox su, /etc/passwd of --libfabric)
#     user-bg:WORD+WORD+...   that in the background; wait-bg waits for it (its exit status)
#     wait-bg                 wait for the last user-bg command
#     listening:PORT[:SECS]   wait until something listens on TCP PORT here, at most SECS (60)
#     shell                   an interactive shell on the console
#     probe                   print SVNIC-PROBE ok and power off at once (the launcher's KVM probe)
#
# Markers on the console, one line each, for tests to match:
#   SVNIC-BOOT ok kernel=... modules=...
#   SVNIC-NET eth0 mac=... ip=...
#   SVNIC-STEP <step> ok|FAIL [detail]
#   SVNIC-STATS eth0 rx_packets=N tx_packets=N
#   SVNIC-RESULT PASS | SVNIC-RESULT FAIL failed=<steps>
# and then the guest powers off (with QEMU's -no-reboot, QEMU exits).

/bin/busybox mkdir -p /proc /sys /dev /tmp /run /root
/bin/busybox mount -t devtmpfs dev /dev
# The initramfs has no /dev/console node, so the kernel could not give us stdin/stdout/stderr.
exec </dev/console >/dev/console 2>&1
echo # the firmware may have left the cursor mid-line
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root
mount -t proc proc /proc
mount -t sysfs sys /sys

finish() {
    sync
    poweroff -f
    sleep 5
}

if [ "$RUN" = probe ]; then
    echo "SVNIC-PROBE ok"
    finish
fi

loaded=""
while read -r m; do
    [ -n "$m" ] || continue
    if insmod "/lib/modules/$m.ko"; then
        loaded="$loaded${loaded:+,}$m"
    else
        echo "SVNIC-BOOT FAIL insmod $m"
    fi
done </lib/modules/load-order
echo "SVNIC-BOOT ok kernel=$(uname -r) modules=$loaded"

if [ -n "$HUGEPAGES" ]; then
    echo "$HUGEPAGES" >/proc/sys/vm/nr_hugepages
    mkdir -p /dev/hugepages
    mount -t hugetlbfs none /dev/hugepages
    echo "SVNIC-HUGEPAGES $(cat /proc/sys/vm/nr_hugepages)"
fi

ip link set lo up
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do
    sleep 0.2
    i=$((i + 1))
done
if [ -e /sys/class/net/eth0 ]; then
    ip link set eth0 up
    [ -n "$IP" ] && ip addr add "$IP" dev eth0
    echo "SVNIC-NET eth0 mac=$(cat /sys/class/net/eth0/address) ip=${IP:-none}"
else
    echo "SVNIC-NET FAIL no eth0"
fi

# Retries a command for up to $1 seconds.
retry() {
    deadline=$(($(date +%s) + $1))
    shift
    until "$@"; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 1
    done
}

tcp_echo_once() {
    got=$(echo "$2" | timeout 10 nc -w 5 "$1" "$3" 2>/dev/null)
    [ "$got" = "$2" ]
}

# Whether something listens on TCP port $1 (state 0A in /proc/net/tcp, the port in hex).
listens() {
    hex=$(printf ':%04X' "$1")
    awk -v p="$hex" 'NR > 1 && substr($2, length($2) - 4) == p && $4 == "0A" {f = 1} END {exit !f}' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

as_nobody() {
    su -s /bin/sh -c "$1" nobody
}

quit_once() {
    echo quit | timeout 10 nc -w 5 "$1" "$2" >/dev/null 2>&1
}

# Runs one step, e.g. "ping:10.0.0.2:3": the verb, then ':'-separated fields (cmd takes the rest
# verbatim, colons and all).
run_step() {
    verb=${1%%:*}
    rest=${1#"$verb"}
    rest=${rest#:}
    case "$verb" in
    cmd)
        sh -c "$(echo "$rest" | tr '+' ' ')"
        return ;;
    user)
        as_nobody "$(echo "$rest" | tr '+' ' ')"
        return ;;
    user-bg)
        as_nobody "$(echo "$rest" | tr '+' ' ')" &
        bg_pid=$!
        return ;;
    esac
    IFS=:
    # shellcheck disable=SC2086 # split the fields on purpose
    set -- $rest
    IFS=$old_ifs
    case "$verb" in
    ping)
        ping -c "${2:-3}" -w 30 "$1" ;;
    echo-server)
        nc -ll -p "${1:-7}" -e cat &
        sleep 0.2
        kill -0 $! ;;
    tcp-echo)
        retry 30 tcp_echo_once "$1" "svnic-echo-$$-$(date +%s)" "${2:-7}" ;;
    wait-quit)
        timeout "${2:-120}" nc -l -p "${1:-9}" </dev/null >/dev/null ;;
    quit)
        retry 30 quit_once "$1" "${2:-9}" ;;
    sleep)
        sleep "${1:-1}" ;;
    wait-bg)
        [ -n "$bg_pid" ] && wait "$bg_pid" ;;
    listening)
        retry "${2:-60}" listens "$1" ;;
    shell)
        echo "svnic guest shell; 'exit' powers off"
        setsid cttyhack sh ;;
    *)
        echo "unknown step '$verb'"
        return 2 ;;
    esac
}

failed=""
old_ifs=$IFS
IFS=,
for step in ${RUN:-shell}; do
    IFS=$old_ifs
    if run_step "$step"; then
        echo "SVNIC-STEP $step ok"
    else
        echo "SVNIC-STEP $step FAIL (exit $?)"
        failed="$failed${failed:+,}$step"
    fi
    IFS=,
done
IFS=$old_ifs

if [ -e /sys/class/net/eth0 ]; then
    s=/sys/class/net/eth0/statistics
    echo "SVNIC-STATS eth0 rx_packets=$(cat $s/rx_packets) tx_packets=$(cat $s/tx_packets)"
fi
if [ -z "$failed" ]; then
    echo "SVNIC-RESULT PASS"
else
    echo "SVNIC-RESULT FAIL failed=$failed"
fi
finish
