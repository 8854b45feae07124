#!/usr/bin/env bash
# Builds the svnic test guest: the current Debian 12 cloud kernel and a small busybox initramfs
# with the virtio-net modules, vm-images/init.sh as /init, and our static guest binaries when they
# have been built. Idempotent: everything is cached under vm-images/build/ (git-ignored) and a
# rerun with unchanged inputs only checks. Needs nothing but the Debian package mirrors.
#
#   vm-images/build.sh [--build-guest] [--libfabric]
#
# Outputs (stable paths, used by vm-images/launch.sh and the VM tests):
#   vm-images/build/vmlinuz              the kernel
#   vm-images/build/initramfs.cpio.gz    the initramfs
#   vm-images/build/manifest             what went into them
#
# Environment:
#   SVNIC_VM_BUILD        build directory (default vm-images/build)
#   SVNIC_KERNEL_PKG      kernel package to use (default: what linux-image-cloud-amd64 depends on)
#   SVNIC_EXTRA_MODULES   more modules to load at boot, in order (e.g. "uio uio_pci_generic")
#   SVNIC_GUEST_BIN_DIR   where the static guest binaries are
#                         (default target/x86_64-unknown-linux-gnu/release; honours CARGO_TARGET_DIR)
#   SVNIC_FI_PROVIDER     the libfabric provider to include with --libfabric
#                         (default target/release/libsvnic_fi.so; honours CARGO_TARGET_DIR)
#
# --build-guest first builds the guest binaries (svnic-guest, svnic-guestd) statically with cargo,
# and with --libfabric the provider (release) too.
# --libfabric adds libfabric (the host's Debian libfabric1 and libfabric-bin: fi_pingpong, fi_info,
# every library they and the provider load, and the dynamic loader, resolved with ldd) and
# libsvnic-fi.so (in /lib/svnic-fi: FI_PROVIDER_PATH=/lib/svnic-fi in the guest), plus an
# /etc/passwd with user nobody (65534) for busybox su. It fails if they are missing on the host.
# Installing packages (qemu-system-x86, cpio, ...) needs root; it is skipped when they are present.
# busybox-static is not installed (it conflicts with Debian's busybox package): like the kernel, it
# is downloaded and unpacked into the build directory.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
build=${SVNIC_VM_BUILD:-$here/build}
guest_bin_dir=${SVNIC_GUEST_BIN_DIR:-${CARGO_TARGET_DIR:-$repo/target}/x86_64-unknown-linux-gnu/release}
guest_bins=(svnic-guest svnic-guestd)
build_guest=0
with_libfabric=0
fi_provider=${SVNIC_FI_PROVIDER:-${CARGO_TARGET_DIR:-$repo/target}/release/libsvnic_fi.so}

for arg in "$@"; do
    case "$arg" in
    --build-guest) build_guest=1 ;;
    --libfabric) with_libfabric=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "build.sh: unknown argument '$arg' (try --help)" >&2
        exit 2
        ;;
    esac
done

say() { echo "vm-images: $*"; }
die() {
    echo "vm-images: error: $*" >&2
    exit 1
}

mkdir -p "$build/debs"

# --- host tools ------------------------------------------------------------------------------------

apt_updated=0
apt_update_once() {
    if [ "$apt_updated" = 0 ]; then
        say "apt-get update"
        apt-get update -qq
        apt_updated=1
    fi
}

# apt_install PACKAGE...: installs the packages (root only), running apt-get update once if apt
# does not know one of them.
apt_install() {
    if [ "$(id -u)" != 0 ]; then
        die "please install (as root): apt-get install $*"
    fi
    local p
    for p in "$@"; do
        apt-cache show --no-all-versions "$p" >/dev/null 2>&1 || apt_update_once
    done
    say "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

need=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
command -v cpio >/dev/null 2>&1 || need+=(cpio)
command -v gzip >/dev/null 2>&1 || need+=(gzip)
command -v sha256sum >/dev/null 2>&1 || need+=(coreutils)
command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script expects Debian 12"
if ((${#need[@]})); then
    apt_install "${need[@]}"
fi

# --- Debian packages: resolve, download (verified), unpack -----------------------------------------

# resolve: prints apt's download lines ('URI' FILE SIZE HASH) for the kernel package and
# busybox-static. The kernel is what the metapackage linux-image-cloud-amd64 depends on (the
# current Debian 12 cloud kernel) unless SVNIC_KERNEL_PKG names one.
resolve() {
    local kpkg=${SVNIC_KERNEL_PKG:-}
    if [ -z "$kpkg" ]; then
        kpkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
            awk '$1 == "Depends:" && $2 ~ /^linux-image-.*-cloud-amd64$/ {print $2; exit}')
    fi
    [ -n "$kpkg" ] || return 1
    apt-get download --print-uris "$kpkg" busybox-static 2>/dev/null
}

# apt is slow to query here (about a second a call), and the answer only changes when its package
# lists do: reuse the last answer while the lists and SVNIC_KERNEL_PKG are unchanged.
lists_key() {
    {
        echo "${SVNIC_KERNEL_PKG:-}"
        stat -c '%n %Y %s' /var/lib/apt/lists/*Packages* 2>/dev/null || true
    } | sha256sum | cut -d' ' -f1
}
resolve_key=$(lists_key)
if [ -s "$build/resolved" ] && [ "$(cat "$build/resolved.key" 2>/dev/null)" = "$resolve_key" ]; then
    uris=$(cat "$build/resolved")
else
    uris=$(resolve) || uris=""
fi

# fetch_deb FILE-PREFIX: prints the path of the .deb whose apt download line starts with that file
# name prefix, downloading it with apt-get download unless it is already in $build/debs. Its
# SHA256 is checked against apt's (signed) index once, when it arrives; a .ok stamp records that.
fetch_deb() {
    local line file pkg want
    line=$(echo "$uris" | awk -v p="$1" 'index($2, p) == 1 {print; exit}')
    [ -n "$line" ] || return 1
    file=$(echo "$line" | awk '{print $2}')
    want=$(echo "$line" | awk '{print $4}')
    if [ ! -e "$build/debs/$file.ok" ]; then
        pkg=${file%%_*}
        rm -f "$build/debs/$file"
        say "downloading $file" >&2
        (cd "$build/debs" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" >/dev/null) ||
            return 1
        if [ "${want%%:*}" = SHA256 ] &&
            [ "$(sha256sum "$build/debs/$file" | cut -d' ' -f1)" != "${want#SHA256:}" ]; then
            echo "vm-images: $file does not match apt's SHA256" >&2
            return 1
        fi
        touch "$build/debs/$file.ok"
    fi
    echo "$build/debs/$file"
}

fetch_all() {
    kernel_deb=$(fetch_deb linux-image-) && busybox_deb=$(fetch_deb busybox-static_)
}

# Stale or missing package lists: update them once (root only) and try again.
if ! fetch_all; then
    [ "$(id -u)" = 0 ] ||
        die "apt cannot resolve or download the kernel and busybox-static (as root: apt-get update)"
    apt_update_once
    resolve_key=$(lists_key)
    uris=$(resolve) || uris=""
    fetch_all || die "apt cannot resolve or download the kernel \
(${SVNIC_KERNEL_PKG:-linux-image-cloud-amd64}) and busybox-static"
fi
echo "$uris" >"$build/resolved"
echo "$resolve_key" >"$build/resolved.key"

# unpack DEB DIR: dpkg -x DEB into DIR once.
unpack() {
    if [ ! -e "$2/.unpacked" ]; then
        rm -rf "$2"
        mkdir -p "$2"
        dpkg -x "$1" "$2"
        touch "$2/.unpacked"
    fi
}

kernel_pkg=$(basename "$kernel_deb")
kernel_pkg=${kernel_pkg%%_*}
kernel_dir=$build/unpacked/$(basename "$kernel_deb" .deb)
busybox_dir=$build/unpacked/$(basename "$busybox_deb" .deb)
unpack "$kernel_deb" "$kernel_dir"
unpack "$busybox_deb" "$busybox_dir"

vmlinuz=$(find "$kernel_dir/boot" -name 'vmlinuz-*' | head -n1)
[ -n "$vmlinuz" ] || die "no vmlinuz in $kernel_deb"
kver=${vmlinuz##*/vmlinuz-}
moddir=$kernel_dir/lib/modules/$kver
busybox=$busybox_dir/bin/busybox
[ -x "$busybox" ] || die "no bin/busybox in $busybox_deb"

# --- the initramfs tree ----------------------------------------------------------------------------

stage=$build/initramfs.d
rm -rf "$stage"
mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,lib/modules,etc,proc,sys,dev,tmp,run,root}
cp "$here/init.sh" "$stage/init"
chmod 755 "$stage/init"
cp "$busybox" "$stage/bin/busybox"

# Modules: virtio_pci and virtio_net plus everything they depend on (read from each module's
# .modinfo "depends=" field, since the package has no modules.dep), dependencies first. Built-in
# ones (listed in modules.builtin) are skipped. Compressed modules are unpacked for busybox insmod.
declare -A module_state=()
load_order=()
builtin=()

module_file() {
    local alt=${1//_/-}
    find "$moddir/kernel" \( -name "$1.ko" -o -name "$1.ko.xz" -o -name "$1.ko.zst" \
        -o -name "$alt.ko" -o -name "$alt.ko.xz" -o -name "$alt.ko.zst" \) -print -quit
}

add_module() {
    local m=${1//-/_} src dst deps d
    case "${module_state[$m]:-}" in
    loaded) return 0 ;;
    busy) die "module dependency cycle at $m" ;;
    esac
    module_state[$m]=busy
    src=$(module_file "$m")
    if [ -z "$src" ]; then
        if grep -Eq "/(${m}|${m//_/-})\.ko$" "$moddir/modules.builtin"; then
            builtin+=("$m")
            module_state[$m]=loaded
            return 0
        fi
        die "module $m is neither in $kernel_pkg nor built into it"
    fi
    dst=$stage/lib/modules/$m.ko
    case "$src" in
    *.ko.xz)
        command -v xz >/dev/null 2>&1 || apt_install xz-utils
        xz -dc "$src" >"$dst"
        ;;
    *.ko.zst)
        command -v zstd >/dev/null 2>&1 || apt_install zstd
        zstd -qdc "$src" >"$dst"
        ;;
    *) cp "$src" "$dst" ;;
    esac
    deps=$(tr '\0' '\n' <"$dst" | sed -n 's/^depends=//p' | head -n1)
    for d in ${deps//,/ }; do
        add_module "$d"
    done
    load_order+=("$m")
    module_state[$m]=loaded
}

# shellcheck disable=SC2086 # a space-separated list on purpose
for m in virtio_pci virtio_net ${SVNIC_EXTRA_MODULES:-}; do
    add_module "$m"
done
printf '%s\n' "${load_order[@]}" >"$stage/lib/modules/load-order"

# Our static guest binaries, when built (see docs/vm.md).
if [ "$build_guest" = 1 ]; then
    say "building the static guest binaries"
    (cd "$repo" && RUSTFLAGS='-C target-feature=+crt-static' \
        cargo build --release --target x86_64-unknown-linux-gnu -p svnic-guest-tools -p svnic-guestd --bins)
    if [ "$with_libfabric" = 1 ]; then
        say "building the libfabric provider (release)"
        (cd "$repo" && cargo build --release -p svnic-libfabric --lib)
    fi
fi
included=()
for b in "${guest_bins[@]}"; do
    if [ -f "$guest_bin_dir/$b" ]; then
        if command -v strip >/dev/null 2>&1; then
            strip --strip-debug -o "$stage/bin/$b" "$guest_bin_dir/$b"
        else
            cp "$guest_bin_dir/$b" "$stage/bin/$b"
        fi
        chmod 755 "$stage/bin/$b"
        included+=("$b")
    fi
done

# libfabric: the host's tools and libraries at the same paths in the guest (same Debian 12
# userland), the closure of what they load as ldd resolves it. libfabric 1.17 of Debian has its
# providers built in (no provider directory to dlopen from); ibverbs and psm2 find no devices.
fi_files=()
if [ "$with_libfabric" = 1 ]; then
    command -v ldd >/dev/null 2>&1 || die "--libfabric needs ldd (libc-bin)"
    fi_tools=()
    for t in fi_pingpong fi_info; do
        p=$(command -v "$t") || die "--libfabric: $t not found (scripts/setup.sh installs libfabric-bin)"
        fi_tools+=("$p")
    done
    [ -f "$fi_provider" ] || die "--libfabric: $fi_provider not found (build it: --build-guest --libfabric)"
    mkdir -p "$stage/lib/svnic-fi"
    if command -v strip >/dev/null 2>&1; then
        strip --strip-debug -o "$stage/lib/svnic-fi/libsvnic-fi.so" "$fi_provider"
    else
        cp "$fi_provider" "$stage/lib/svnic-fi/libsvnic-fi.so"
    fi
    for t in "${fi_tools[@]}"; do
        cp "$t" "$stage/usr/bin/"
        fi_files+=("/usr/bin/${t##*/}")
    done
    libs=$(ldd "${fi_tools[@]}" "$fi_provider" |
        awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u)
    [ -n "$libs" ] || die "--libfabric: ldd found no libraries"
    for l in $libs; do
        mkdir -p "$stage$(dirname "$l")"
        cp -L "$l" "$stage$l"
        fi_files+=("$l")
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n' >"$stage/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$stage/etc/group"
fi

{
    echo "kernel_package=$(basename "$kernel_deb")"
    echo "kernel_release=$kver"
    echo "busybox_package=$(basename "$busybox_deb")"
    echo "modules=${load_order[*]}"
    echo "builtin_modules=${builtin[*]}"
    echo "guest_binaries=${included[*]}"
    echo "libfabric=${fi_files[*]}${fi_files[*]:+ /lib/svnic-fi/libsvnic-fi.so}"
} >"$stage/etc/svnic-image"

# --- pack, unless the same tree was packed before --------------------------------------------------

# The key covers every path, its type and mode, and every file's contents.
key=$(cd "$stage" && {
    find . -printf '%p %y %m %l\n' | LC_ALL=C sort
    find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
} | sha256sum | cut -d' ' -f1)

initramfs=$build/initramfs.cpio.gz
if [ -s "$initramfs" ] && [ "$(cat "$build/initramfs.key" 2>/dev/null)" = "$key" ]; then
    say "initramfs up to date ($key)"
else
    say "packing initramfs"
    find "$stage" -exec touch -h -d @0 {} +
    (cd "$stage" && find . -print0 | LC_ALL=C sort -z |
        cpio --null --create --format=newc --owner=0:0 --reproducible --quiet) |
        gzip -n -6 >"$initramfs.tmp"
    mv "$initramfs.tmp" "$initramfs"
    echo "$key" >"$build/initramfs.key"
fi

# A copy rather than a symlink: the build directory can move, or be mounted elsewhere.
if ! cmp -s "$vmlinuz" "$build/vmlinuz"; then
    cp "$vmlinuz" "$build/vmlinuz.tmp"
    mv "$build/vmlinuz.tmp" "$build/vmlinuz"
fi

{
    cat "$stage/etc/svnic-image"
    echo "initramfs_key=$key"
    echo "qemu=$(qemu-system-x86_64 --version | head -n1)"
} >"$build/manifest"

say "kernel $kver ($kernel_pkg), modules: ${load_order[*]}${builtin[*]:+ (built in: ${builtin[*]})}"
if ((${#included[@]})); then
    say "guest binaries: ${included[*]} (from $guest_bin_dir)"
else
    say "guest binaries: none yet (looked in $guest_bin_dir; see docs/vm.md)"
fi
if [ "$with_libfabric" = 1 ]; then
    say "libfabric: ${#fi_files[@]} files and /lib/svnic-fi/libsvnic-fi.so (from $fi_provider)"
fi
say "ready: $build/vmlinuz $initramfs ($(du -k "$initramfs" | cut -f1) KiB)"
