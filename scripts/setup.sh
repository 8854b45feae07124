#!/usr/bin/env bash
# Installs what building and testing svnic needs on a fresh Debian 12 machine. Idempotent.
# The Rust toolchain (cargo) is expected to be installed already; clippy and rustfmt are added
# with rustup if missing.
set -euo pipefail

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
# as and objcopy assemble the micro-VM's guest programs (guest-driver/microvm/build.rs).
{ command -v as && command -v objcopy; } >/dev/null 2>&1 || need_apt+=(binutils)
# `ip` and `ss` (network namespaces and veth pairs: the guest agent's tests and the hosts of the
# uplink tests in tests/tests/wire.rs, which skip without them).
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# kill(1), with which the VM tests stop QEMU (tests/src/vm.rs). `type -P` looks on PATH only:
# bash's builtin `kill` would otherwise hide a missing procps (absent from minimal images).
type -P kill >/dev/null 2>&1 || need_apt+=(procps)
# libfabric 1.17 (the svnic provider's tests load it into fi_info and fi_pingpong, and build a C
# test program against its headers): the library, its headers, and its tools.
[ -e /usr/lib/x86_64-linux-gnu/libfabric.so.1 ] || ldconfig -p 2>/dev/null | grep -q 'libfabric\.so\.1 ' ||
    need_apt+=(libfabric1)
[ -e /usr/include/rdma/fabric.h ] || need_apt+=(libfabric-dev)
command -v fi_pingpong >/dev/null 2>&1 || need_apt+=(libfabric-bin)
# Open MPI 4.1 (its OFI MTL runs over the provider), mpicc for the collectives test program, and
# NetPIPE built for Open MPI (tests/tests/libfabric_mpi.rs).
command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
command -v NPopenmpi >/dev/null 2>&1 || need_apt+=(netpipe-openmpi)
if ((${#need_apt[@]})); then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
    else
        echo "setup: please install: ${need_apt[*]}" >&2
        exit 1
    fi
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo not found (install Rust via rustup)" >&2; exit 1; }
# clippy and rustfmt: added with rustup when missing (a toolchain installed otherwise must bring
# them itself).
for tool in clippy:clippy fmt:rustfmt; do
    sub=${tool%%:*} component=${tool#*:}
    cargo "$sub" --version >/dev/null 2>&1 && continue
    command -v rustup >/dev/null 2>&1 ||
        { echo "setup: cargo $sub not found and no rustup to add $component with" >&2; exit 1; }
    rustup component add "$component"
done
