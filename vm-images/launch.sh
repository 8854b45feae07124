#!/usr/bin/env bash
# Starts one svnic test guest under QEMU 7.2, its virtio-net NIC served by svnic over vhost-user.
#
#   vm-images/launch.sh --socket PATH --mac MAC [options] [-- EXTRA-QEMU-ARGS...]
#
#   --socket PATH    the guest's vhost-user socket (svnic serve --guest ...,socket=PATH); without
#                    it the guest has no NIC
#   --mac MAC        the NIC's MAC address (must be the guest's mac= in svnic serve)
#   --mem SIZE       guest memory, e.g. 256M or 1G (default 512M); all of it is a shared memfd
#   --log FILE       write the serial console to FILE (default: the terminal, Ctrl-a x quits)
#   --append WORDS   more kernel command line: what the guest does (IP=..., RUN=...; see
#                    docs/vm.md and vm-images/init.sh)
#   --accel MODE     auto (default; or $SVNIC_ACCEL), kvm or tcg. auto boots a throwaway guest
#                    under KVM first and uses KVM only if that guest gets to /init; otherwise TCG
#   --kernel FILE    default vm-images/build/vmlinuz
#   --initrd FILE    default vm-images/build/initramfs.cpio.gz
#   --machine TYPE   QEMU machine type (default pc)
#   --name NAME      QEMU's -name (shows in ps)
#   --dry-run        print the QEMU command line and exit
#
# The accelerator chosen, and why, is printed on stderr ("launch.sh: accelerator: tcg (...)"),
# then the exact QEMU command line. QEMU replaces this script (exec): the process id stays the same
# and signals reach QEMU. The guest powers off when its RUN steps are done; -no-reboot makes QEMU
# exit then.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${SVNIC_VM_BUILD:-$here/build}
qemu=${QEMU:-qemu-system-x86_64}

socket=""
mac=""
mem=512M
log=""
append=""
accel=${SVNIC_ACCEL:-auto}
kernel=$build/vmlinuz
initrd=$build/initramfs.cpio.gz
machine=pc
name=""
dry_run=0
extra=()

die() {
    echo "launch.sh: $*" >&2
    exit 2
}

while (($#)); do
    case "$1" in
    --socket | --mac | --mem | --log | --append | --accel | --kernel | --initrd | --machine | --name)
        (($# >= 2)) || die "$1 needs a value"
        v=$2
        case "$1" in
        --socket) socket=$v ;;
        --mac) mac=$v ;;
        --mem) mem=$v ;;
        --log) log=$v ;;
        --append) append=$v ;;
        --accel) accel=$v ;;
        --kernel) kernel=$v ;;
        --initrd) initrd=$v ;;
        --machine) machine=$v ;;
        --name) name=$v ;;
        esac
        shift 2
        ;;
    --dry-run)
        dry_run=1
        shift
        ;;
    --)
        shift
        extra=("$@")
        break
        ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument '$1' (try --help)" ;;
    esac
done

[[ "$mem" =~ ^[1-9][0-9]*[MG]$ ]] || die "--mem '$mem': expected a size like 256M or 1G"
if [ -n "$socket" ]; then
    [[ "$mac" =~ ^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$ ]] ||
        die "--mac '$mac': expected a MAC address like 52:54:00:00:00:01"
fi
case "$accel" in auto | kvm | tcg) ;; *) die "--accel '$accel': expected auto, kvm or tcg" ;; esac
case "$append" in *\'* | *\"*) die "--append: no quotes: values cannot hold spaces (see docs/vm.md)" ;; esac
if [ "$dry_run" = 0 ] || [ "$accel" = auto ]; then
    [ -f "$kernel" ] || die "no kernel at $kernel (run vm-images/build.sh)"
    [ -f "$initrd" ] || die "no initramfs at $initrd (run vm-images/build.sh)"
    command -v "$qemu" >/dev/null 2>&1 || die "$qemu not found (run vm-images/build.sh)"
fi

# probe_kvm: boots the same kernel and initramfs under KVM, with the CPU model a KVM launch uses,
# and RUN=probe (/init prints a marker and powers off at once). KVM is usable only if the marker
# shows up in time. On a host whose KVM cannot run this guest, QEMU aborts at once (a paravirtual
# KVM refusing MSRs) or the guest crawls (caught by the timeout). Sets kvm_why.
probe_kvm() {
    kvm_why=""
    if [ ! -e /dev/kvm ]; then
        kvm_why="no /dev/kvm"
        return 1
    fi
    if [ ! -r /dev/kvm ] || [ ! -w /dev/kvm ]; then
        kvm_why="/dev/kvm is not accessible to $(id -un)"
        return 1
    fi
    local tmp rc=0 secs=15
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/svnic-kvm-probe.XXXXXX")
    # (The braces keep bash from reporting an aborted QEMU on stderr: the reason is printed below.)
    {
        timeout --kill-after=2 "$secs" "$qemu" -machine "$machine" -accel kvm -cpu host -smp 1 \
            -m 128M -nodefaults -no-user-config -display none -no-reboot \
            -kernel "$kernel" -initrd "$initrd" -append "console=ttyS0 quiet panic=-1 RUN=probe" \
            -serial "file:$tmp/serial" </dev/null >"$tmp/out" 2>&1
    } 2>/dev/null || rc=$?
    if grep -q '^SVNIC-PROBE ok' "$tmp/serial" 2>/dev/null; then
        rm -rf "$tmp"
        return 0
    fi
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        kvm_why="a KVM guest did not reach /init within $secs s"
    else
        kvm_why=$(grep -m1 -i 'error' "$tmp/out" || head -n1 "$tmp/out" || true)
        kvm_why="QEMU -accel kvm exited with status $rc${kvm_why:+: $kvm_why}"
    fi
    rm -rf "$tmp"
    return 1
}

case "$accel" in
auto)
    if probe_kvm; then
        accel=kvm
        echo "launch.sh: accelerator: kvm (a KVM test guest booted)" >&2
    else
        accel=tcg
        echo "launch.sh: accelerator: tcg (KVM not usable: $kvm_why)" >&2
    fi
    ;;
*) echo "launch.sh: accelerator: $accel (as asked)" >&2 ;;
esac

cmd=("$qemu")
[ -n "$name" ] && cmd+=(-name "$name")
cmd+=(-machine "$machine" -accel "$accel")
[ "$accel" = kvm ] && cmd+=(-cpu host)
cmd+=(-smp 1 -m "$mem"
    -object "memory-backend-memfd,id=mem,size=$mem,share=on" -numa "node,memdev=mem")
if [ -n "$socket" ]; then
    # QEMU 7.2 + vhost-user-net under TCG segfaults in msix_set_vector_notifiers when the guest
    # starts the device; vectors=0 (legacy INTx) avoids it. Under KVM, MSI-X is kept. romfile=
    # (empty) skips the NIC's iPXE boot ROM: the kernel is loaded directly.
    vectors=""
    [ "$accel" = tcg ] && vectors=",vectors=0"
    cmd+=(-chardev "socket,id=c0,path=$socket" -netdev "vhost-user,id=n0,chardev=c0"
        -device "virtio-net-pci,netdev=n0,mac=$mac$vectors,romfile=")
fi
cmd+=(-kernel "$kernel" -initrd "$initrd" -append "console=ttyS0 quiet panic=-1${append:+ $append}"
    -nodefaults -no-user-config -nographic -no-reboot)
if [ -n "$log" ]; then
    cmd+=(-serial "file:$log" -monitor none)
else
    cmd+=(-serial mon:stdio)
fi
cmd+=("${extra[@]}")

# Print the command so that it can be pasted into a shell.
shown=""
for a in "${cmd[@]}"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./:,=@%+-]+$ ]]; then
        shown+=" $a"
    else
        shown+=" '${a//\'/\'\\\'\'}'"
    fi
done
echo "launch.sh:$shown" >&2
[ "$dry_run" = 1 ] && exit 0
exec "${cmd[@]}"
