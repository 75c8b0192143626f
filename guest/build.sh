#!/usr/bin/env bash
# Build a test guest into guest/out/.
#
#   bash guest/build.sh mini           -> guest/out/mini.elf
#   bash guest/build.sh mini-noftrace  -> guest/out/mini-noftrace.elf (no ftrace sites)
#   bash guest/build.sh mini-percpu-addr -> guest/out/mini-percpu-addr.elf (per-CPU
#                                      symbols as kernel addresses, as Linux 6.15+)
#   bash guest/build.sh mini-rethunk   -> guest/out/mini-rethunk.elf (returns through
#                                      a counting __x86_return_thunk)
#   bash guest/build.sh workload       -> guest/out/workload.cpio.gz: an initramfs whose
#                                      /init is guest/linux/workload.c (for any of the
#                                      Linux guests' kernels; they are not rebuilt)
#   bash guest/build.sh linux [ARGS]   -> runs guest/linux/build.sh ARGS
#   bash guest/build.sh linux-acpi [ARGS] -> linux/build.sh --variant acpi ARGS,
#                                      guest/out/linux-acpi/{bzImage,vmlinux,...}
#   bash guest/build.sh linux-noftrace [ARGS] -> linux/build.sh --variant noftrace ARGS,
#                                      guest/out/linux-noftrace/ (no __mcount_loc)
#   bash guest/build.sh linux-6.12 [ARGS] -> the same from linux-source-6.12,
#                                      guest/out/linux-6.12/{bzImage,vmlinux,...},
#                                      and vmt_nobtf.ko (add_vmt_nobtf)
#   bash guest/build.sh debian-6.12    -> guest/out/debian-6.12/{vmlinuz,config,System.map,binfmt_misc.ko,
#                                      kyber-iosched.ko}:
#                                      Debian's own 6.12 cloud kernel, not built but
#                                      downloaded (a distribution kernel: KASLR, IBT,
#                                      return thunks, ITS, call-depth tracking)
#   bash guest/build.sh vmt-test       -> guest/out/debian-6.12/{vmt_test.ko,vmt_nobtf.ko,workload-vmt.cpio.gz}:
#                                      the test module built against Debian 6.12's
#                                      headers, and the workload initramfs with it and
#                                      the package's own binfmt_misc.ko and kyber-iosched.ko
#   bash guest/build.sh debian-6.1     -> guest/out/debian-6.1/{vmlinuz,config,System.map}:
#                                      bookworm's own 6.1 cloud kernel, downloaded (it
#                                      takes a hot-added vCPU under TCG: 6.12 does not;
#                                      it has GCC's `.cold` fragments: 6.12's has none)
#   bash guest/build.sh debian-5.10    -> guest/out/debian-5.10/{vmlinuz,config,System.map,
#                                      binfmt_misc.ko,workload-mod.cpio.gz}:
#                                      bullseye's own 5.10 cloud kernel (before 5.13: no
#                                      free low MiB proven), fetched with curl through
#                                      bullseye's Packages index (not in the apt sources)
#                                      and checked against its SHA256
#
# Environment: CC (default gcc), LD (default ld), FORCE=1 rebuilds even when
# the output is up to date. Safe to run concurrently: each run builds in its
# own temporary directory and renames the result into place.
set -euo pipefail

self="${BASH_SOURCE[0]}"
[[ "$self" == */* ]] || self="./$self"
here="$(cd "${self%/*}" && pwd)"
out="$here/out"

# Copies an unpacked Debian kernel's files into DST, each renamed into place:
# a test reading guest/out while another test's run copies them never sees
# a half-written file.
# The modules keep their times: build_vmt_test rebuilds the initramfs when
# it is newer.
install_unpacked() {
	local f
	for f in vmlinuz config System.map; do
		cp -f "$1/$f" "$2/.$f.tmp.$$"
		mv -f "$2/.$f.tmp.$$" "$2/$f"
	done
	for f in binfmt_misc.ko kyber-iosched.ko; do
		[[ -f "$1/$f" ]] || continue
		cp -fp "$1/$f" "$2/.$f.tmp.$$"
		mv -f "$2/.$f.tmp.$$" "$2/$f"
	done
}
CC="${CC:-gcc}"
LD="${LD:-ld}"

usage() {
	echo "usage: guest/build.sh mini | mini-noftrace | mini-percpu-addr | mini-rethunk | workload | linux | linux-acpi | linux-noftrace | linux-6.12 | debian-6.12 | vmt-test | debian-6.1 | debian-5.10 [ARGS...]" >&2
	exit 1
}

# The kernel's ftrace instrumentation: a 5-byte NOP (0f 1f 44 00 00) at every
# traced function's entry, its address recorded in __mcount_loc.
MINI_CFLAGS=(
	-std=gnu11 -O2 -Wall -Wextra
	-pg -mfentry -mrecord-mcount -mnop-mcount
	-DMINI_FTRACE # entry.S's hand-written site (graph_tail_caller) follows -pg
	-mcmodel=kernel -ffreestanding -fno-pic -fno-pie -nostdlib
	-fno-stack-protector -mno-red-zone
	-mno-sse -mno-mmx -mno-sse2 -mgeneral-regs-only
	-fno-asynchronous-unwind-tables -fcf-protection=none
	-fno-ipa-sra -fno-optimize-sibling-calls
	-fno-tree-loop-distribute-patterns # no implicit memset/memcpy calls
	# Frame pointers, as a kernel built with CONFIG_FRAME_POINTER: vmtrace's
	# --stack unwinds the mini guest by its RBP chain (it has no ORC
	# tables). Leaves too where gcc honours it (gcc 12 still omits the frame
	# of a function that calls nothing; with -pg no traced one is such a
	# leaf). With -pg -mfentry gcc puts the site (`call __fentry__`, here
	# its NOP) first, before `push %rbp`, as Linux has it. README "Frame
	# pointers".
	-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer
	-g # DWARF, from which pahole writes the BTF (-g changes no code)
)
MINI_LDFLAGS=(-static -nostdlib -z max-page-size=4096 --build-id)

# build_mini NAME [EXTRA_CFLAGS...]: guest/out/NAME.elf
build_mini() {
	local name="$1"
	shift
	local src="$here/mini" dst="$out/$name.elf"
	local cflags=("${MINI_CFLAGS[@]}")
	if [[ "$name" == mini-noftrace ]]; then
		# The same guest built without ftrace instrumentation: no NOPs, an
		# empty __mcount_loc table (for vmtrace's error-path tests).
		cflags=()
		for f in "${MINI_CFLAGS[@]}"; do
			case "$f" in -pg | -mfentry | -mrecord-mcount | -mnop-mcount | -DMINI_FTRACE) ;; *) cflags+=("$f") ;; esac
		done
	fi
	# Linux 6.15+'s per-CPU layout: the section linked in the image, its
	# symbols kernel addresses, GS base = area - __per_cpu_start.
	[[ "$name" == mini-percpu-addr ]] && cflags+=(-DMINI_PERCPU_ADDR)
	# A kernel built with CONFIG_MITIGATION_RETHUNK: every C return is a
	# `jmp __x86_return_thunk` (entry.S's counts them per CPU).
	[[ "$name" == mini-rethunk ]] && cflags+=(-DMINI_RETHUNK -mfunction-return=thunk-extern)

	if ! command -v "$CC" >/dev/null 2>&1; then
		echo "guest/build.sh: $CC not found; install it with: apt-get install gcc" >&2
		exit 2
	fi
	if ! command -v "$LD" >/dev/null 2>&1; then
		echo "guest/build.sh: $LD not found; install it with: apt-get install binutils" >&2
		exit 2
	fi
	if ! command -v pahole >/dev/null 2>&1; then
		echo "guest/build.sh: pahole not found (it writes the mini guest's BTF); install it with: apt-get install dwarves" >&2
		exit 2
	fi

	mkdir -p "$out"
	# Up to date when no source (nor this script) is newer than the output.
	if [[ "${FORCE:-0}" != 1 && -f "$dst" ]] &&
		[[ -z "$(find "$src" "${BASH_SOURCE[0]}" -newer "$dst" -type f ! -name "*.md" -print -quit)" ]]; then
		return 0
	fi

	# Global, not local: the EXIT trap runs after this function returns.
	mini_tmp="$(mktemp -d "$out/.$name.XXXXXX")" # same filesystem: mv is atomic
	trap 'rm -rf "$mini_tmp"' EXIT
	local tmp="$mini_tmp"
	"$CC" "${cflags[@]}" -c "$src/entry.S" -o "$tmp/entry.o"
	"$CC" "${cflags[@]}" -c "$src/direct.S" -o "$tmp/direct.o"
	"$CC" "${cflags[@]}" -c "$src/workload.c" -o "$tmp/workload.o"
	"$CC" "${cflags[@]}" -c "$src/support.c" -o "$tmp/support.o"
	# The link script is preprocessed, as Linux's vmlinux.lds.S is: the
	# build's -D flags choose the per-CPU layout.
	local defines=()
	for f in "${cflags[@]}"; do [[ "$f" == -D* ]] && defines+=("$f"); done
	"$CC" -E -P -undef -x c -D__ASSEMBLER__ "${defines[@]}" -I "$src" "$src/mini.ld" -o "$tmp/mini.lds"
	"$LD" "${MINI_LDFLAGS[@]}" -T "$tmp/mini.lds" -o "$tmp/mini.elf" \
		"$tmp/entry.o" "$tmp/workload.o" "$tmp/support.o" "$tmp/direct.o"
	# BTF from the DWARF, as Linux's CONFIG_DEBUG_INFO_BTF (a .BTF section:
	# the types, per-CPU variables and function prototypes).
	pahole -J "$tmp/mini.elf"
	mv -f "$tmp/mini.elf" "$dst"
	echo "guest/build.sh: built guest/out/$name.elf" >&2
}

# cpio_entry NAME MODE [FILE|MAJOR:MINOR]: one newc record on stdout (root
# owned, mtime 0, so the archive is the same bytes every time), written here
# because GNU cpio can only archive a device node that exists on the host.
cpio_ino=300000
cpio_entry() {
	local name="$1" mode="$2" src="${3:-}" size=0 rmaj=0 rmin=0 nl=1
	case "$src" in
	*:*) rmaj="${src%:*}" rmin="${src#*:}" ;;
	?*) size=$(stat -c %s "$src") ;;
	esac
	((mode & 0040000)) && nl=2
	cpio_ino=$((cpio_ino + 1))
	printf '070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%s\0' \
		"$cpio_ino" "$mode" 0 0 "$nl" 0 "$size" 0 0 "$rmaj" "$rmin" $((${#name} + 1)) 0 "$name"
	head -c $(((4 - (110 + ${#name} + 1) % 4) % 4)) /dev/zero
	if ((size)); then
		cat "$src"
		head -c $(((4 - size % 4) % 4)) /dev/zero
	fi
}

# guest/out/workload.cpio.gz: /init from guest/linux/workload.c, the same
# directories and /dev/console as the Linux guests' own initramfs.
build_workload() {
	local src="$here/linux/workload.c" dst="$out/workload.cpio.gz"
	if ! command -v "$CC" >/dev/null 2>&1; then
		echo "guest/build.sh: $CC not found; install it with: apt-get install gcc" >&2
		exit 2
	fi
	mkdir -p "$out"
	if [[ "${FORCE:-0}" != 1 && -f "$dst" ]] &&
		[[ -z "$(find "$src" "${BASH_SOURCE[0]}" -newer "$dst" -type f -print -quit)" ]]; then
		return 0
	fi
	workload_tmp="$(mktemp -d "$out/.workload.XXXXXX")"
	trap 'rm -rf "$workload_tmp"' EXIT
	local tmp="$workload_tmp"
	"$CC" -Os -static -nostdlib -ffreestanding -fno-builtin -fno-pie -no-pie \
		-fno-stack-protector -fno-asynchronous-unwind-tables -fcf-protection=none \
		-fno-tree-loop-distribute-patterns -Wall -Wextra -Werror \
		-Wl,--build-id=none -o "$tmp/init" "$src"
	{
		cpio_entry dev $((0040755))
		cpio_entry dev/console $((0020600)) 5:1
		cpio_entry proc $((0040755))
		cpio_entry sys $((0040755))
		cpio_entry root $((0040700))
		cpio_entry init $((0100755)) "$tmp/init"
		cpio_entry TRAILER!!! 0
	} | gzip -9 -n >"$tmp/workload.cpio.gz"
	mv -f "$tmp/workload.cpio.gz" "$dst"
	echo "guest/build.sh: built guest/out/workload.cpio.gz (/init $(stat -c %s "$tmp/init") bytes)" >&2
}

# The Debian kernel packages the distribution-kernel tests boot: these
# when the archive still has them, else the newest of their series (the
# archive keeps only the latest security update). 6.12 (bookworm-security
# and backports) and bookworm's own 6.1.
DEBIAN_KERNEL_612="${DEBIAN_KERNEL_612:-linux-image-6.12.117+deb12-cloud-amd64-unsigned}"
DEBIAN_SERIES_612='^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64-unsigned$'
DEBIAN_KERNEL_61="${DEBIAN_KERNEL_61:-linux-image-6.1.0-57-cloud-amd64-unsigned}"
DEBIAN_SERIES_61='^linux-image-6\.1\.0-[0-9]+-cloud-amd64-unsigned$'

DEBIAN_KERNEL_510="${DEBIAN_KERNEL_510:-linux-image-5.10.0-32-cloud-amd64-unsigned}"
DEBIAN_SERIES_510='^linux-image-5\.10\.0-[0-9]+-cloud-amd64-unsigned$'
DEBIAN_INDEX_510="${DEBIAN_INDEX_510:-http://deb.debian.org/debian/dists/bullseye/main/binary-amd64/Packages.xz}"
DEBIAN_POOL="${DEBIAN_POOL:-http://deb.debian.org/debian}"

# Unpacks the .deb in DIR into DIR/boot/{vmlinuz,config,System.map}, and
# DIR/boot/binfmt_misc.ko: the package's own module the modules tests load
# (no hardware to find; its load_misc_binary runs at each execve), and
# DIR/boot/kyber-iosched.ko where the package has it: its smallest module
# with tracepoints (kyber:*) and no dependencies (an I/O scheduler: no
# hardware to find either). Uncompressed (the workload's finit_module
# passes no flags).
unpack_debian_kernel() {
	local dir="$1" ko name
	dpkg-deb -x "$dir"/*.deb "$dir/x"
	mkdir -p "$dir/boot"
	cp "$dir"/x/boot/vmlinuz-* "$dir/boot/vmlinuz"
	cp "$dir"/x/boot/config-* "$dir/boot/config"
	cp "$dir"/x/boot/System.map-* "$dir/boot/System.map"
	for name in fs/binfmt_misc block/kyber-iosched; do
		ko="$(echo "$dir"/x/lib/modules/*/kernel/$name.ko*)"
		[[ -f "$ko" ]] || continue
		case "$ko" in
		*.xz) xz -dc "$ko" >"$dir/boot/${name#*/}.ko" ;;
		*) cp "$ko" "$dir/boot/${name#*/}.ko" ;;
		esac
	done
}

# guest/out/debian-SERIES/ for a release missing from the apt sources
# (bullseye): the package PKG (or the newest matching SERIES_RE) found in
# the Packages index at INDEX, downloaded with curl and checked against the
# index's SHA256, cached as fetch_debian_kernel does.
fetch_debian_kernel_by_index() {
	local series="$1" pkg="$2" series_re="$3" index="$4"
	local dst="$out/debian-$series" cache="${XDG_CACHE_HOME:-$HOME/.cache}/vmtrace/debian"
	local unpacked="$cache/$pkg"
	if [[ ! -f "$unpacked/binfmt_misc.ko" ]]; then
		mkdir -p "$cache"
		debian_tmp="$(mktemp -d "$cache/.$pkg.XXXXXX")"
		trap 'rm -rf "$debian_tmp"' EXIT
		curl -fsSL -o "$debian_tmp/Packages.xz" "$index" || {
			echo "guest/build.sh: cannot fetch $index" >&2
			exit 2
		}
		# Package, Filename and SHA256 of each stanza, one line each.
		local stanzas entry
		stanzas="$(xz -dc "$debian_tmp/Packages.xz" | awk '
			/^Package: /{p=$2} /^Filename: /{f=$2} /^SHA256: /{h=$2}
			/^$/{if (p != "") print p, f, h; p=""; f=""; h=""}')"
		entry="$(awk -v p="$pkg" '$1 == p' <<<"$stanzas" | tail -1)"
		if [[ -z "$entry" ]]; then
			entry="$(awk '{print}' <<<"$stanzas" | grep -E "^${series_re%\$} " | sort -V | tail -1 || true)"
			[[ -n "$entry" ]] || {
				echo "guest/build.sh: no Debian $series cloud kernel package in $index" >&2
				exit 2
			}
			echo "guest/build.sh: $pkg is gone from the archive; using ${entry%% *}" >&2
			pkg="${entry%% *}"
			unpacked="$cache/$pkg"
		fi
		local file sum
		read -r _ file sum <<<"$entry"
		curl -fsSL -o "$debian_tmp/${file##*/}" "$DEBIAN_POOL/$file" || {
			echo "guest/build.sh: cannot fetch $DEBIAN_POOL/$file" >&2
			exit 2
		}
		echo "$sum  $debian_tmp/${file##*/}" | sha256sum -c --quiet - || {
			echo "guest/build.sh: $file does not match the SHA256 in $index" >&2
			exit 2
		}
		unpack_debian_kernel "$debian_tmp"
		rm -rf "$unpacked" && mv "$debian_tmp/boot" "$unpacked"
		echo "guest/build.sh: downloaded $pkg" >&2
	fi
	mkdir -p "$dst"
	install_unpacked "$unpacked" "$dst"
}

# guest/out/debian-SERIES/: the vmlinuz, config and System.map of Debian's
# cloud kernel package PKG (or the newest matching SERIES_RE), downloaded
# once into ~/.cache/vmtrace/debian/.
fetch_debian_kernel() {
	local series="$1" pkg="$2" series_re="$3"
	local dst="$out/debian-$series" cache="${XDG_CACHE_HOME:-$HOME/.cache}/vmtrace/debian"
	if ! apt-cache show "$pkg" >/dev/null 2>&1; then
		apt-get update -q >/dev/null 2>&1 || true
	fi
	if ! apt-cache show "$pkg" >/dev/null 2>&1; then
		local wanted="$pkg"
		pkg="$(apt-cache pkgnames "linux-image-$series" | grep -E "$series_re" | sort -V | tail -1)"
		if [[ -z "$pkg" ]]; then
			echo "guest/build.sh: no Debian $series cloud kernel package in the apt sources; add bookworm, bookworm-security (or bookworm-backports) to them" >&2
			exit 2
		fi
		echo "guest/build.sh: $wanted is gone from the archive; using $pkg" >&2
	fi
	local unpacked="$cache/$pkg"
	# Unpacked before kyber-iosched.ko was kept: unpacked again.
	if [[ ! -f "$unpacked/binfmt_misc.ko" || ! -f "$unpacked/kyber-iosched.ko" ]]; then
		mkdir -p "$cache"
		debian_tmp="$(mktemp -d "$cache/.$pkg.XXXXXX")"
		trap 'rm -rf "$debian_tmp"' EXIT
		(cd "$debian_tmp" && apt-get download -q "$pkg" >/dev/null 2>&1) || {
			echo "guest/build.sh: apt-get download $pkg failed" >&2
			exit 2
		}
		unpack_debian_kernel "$debian_tmp"
		rm -rf "$unpacked" && mv "$debian_tmp/boot" "$unpacked"
		echo "guest/build.sh: downloaded $pkg" >&2
	fi
	mkdir -p "$dst"
	install_unpacked "$unpacked" "$dst"
	# The package's name: build_vmt_test takes the headers of the same one.
	echo "$pkg" >"$dst/package"
}

# guest/out/debian-6.12/{vmt_test.ko,workload-vmt.cpio.gz}: the test module
# (guest/linux/vmt_test) built against the headers of the Debian 6.12 kernel
# fetched above (its linux-headers, -common and linux-kbuild packages,
# downloaded once into ~/.cache/vmtrace/debian/) with the host's gcc-12 (the
# compiler Debian built it with), and the workload initramfs with
# /vmt_test.ko appended as a second cpio (the kernel unpacks both). The
# module is unsigned: this kernel loads it (no MODULE_SIG_FORCE, lockdown
# off) and marks itself tainted (E).
build_vmt_test() {
	fetch_debian_kernel 6.12 "$DEBIAN_KERNEL_612" "$DEBIAN_SERIES_612"
	local dst="$out/debian-6.12" cache="${XDG_CACHE_HOME:-$HOME/.cache}/vmtrace/debian"
	local pkg release version
	pkg="$(cat "$dst/package")"
	release="${pkg#linux-image-}"
	release="${release%-unsigned}"     # 6.12.117+deb12-cloud-amd64
	version="${release%-cloud-amd64}"  # 6.12.117+deb12
	local headers="$cache/linux-headers-$release"
	if [[ ! -d "$headers" ]]; then
		mkdir -p "$cache"
		vmt_tmp="$(mktemp -d "$cache/.headers.XXXXXX")"
		trap 'rm -rf "$vmt_tmp" "${workload_tmp:-}"' EXIT
		(cd "$vmt_tmp" && apt-get download -q "linux-headers-$release" \
			"linux-headers-$version-common" "linux-kbuild-$version" >/dev/null 2>&1) || {
			echo "guest/build.sh: apt-get download of linux-headers-$release failed" >&2
			exit 2
		}
		for deb in "$vmt_tmp"/*.deb; do dpkg-deb -x "$deb" "$vmt_tmp/x"; done
		# Its Makefile includes the -common one by absolute path (/usr/src).
		sed -i 's|^include /usr/src/|include $(dir $(lastword $(MAKEFILE_LIST)))../|' \
			"$vmt_tmp/x/usr/src/linux-headers-$release/Makefile"
		mv "$vmt_tmp/x" "$headers"
		echo "guest/build.sh: downloaded linux-headers-$release" >&2
	fi
	local src="$here/linux/vmt_test" ko="$dst/vmt_test.ko" cpio="$dst/workload-vmt.cpio.gz"
	build_workload
	if [[ "${FORCE:-0}" != 1 && -f "$cpio" && -f "$dst/vmt_nobtf.ko" && "$cpio" -nt "$src/vmt_test.c" && "$cpio" -nt "$src/vmt_test_trace.h" && "$cpio" -nt "$out/workload.cpio.gz" &&
		"$cpio" -nt "$dst/binfmt_misc.ko" && "$cpio" -nt "$dst/kyber-iosched.ko" ]]; then
		return
	fi
	vmt_tmp="$(mktemp -d "$out/.vmt_test.XXXXXX")"
	trap 'rm -rf "$vmt_tmp" "${workload_tmp:-}"' EXIT
	cp "$src/vmt_test.c" "$src/vmt_test_trace.h" "$src/Kbuild" "$vmt_tmp/"
	make -s -C "$headers/usr/src/linux-headers-$release" M="$vmt_tmp" modules >&2
	cp "$vmt_tmp/vmt_test.ko" "$ko.tmp" && mv -f "$ko.tmp" "$ko"
	# The same module without its .BTF (same build id): loaded so, the
	# guest keeps no BTF of it, and `attach --modules DIR` takes its
	# prototypes from vmt_test.ko's DWARF (tests/qemu_modules.rs).
	objcopy --remove-section=.BTF "$ko" "$dst/vmt_nobtf.ko.tmp" && mv -f "$dst/vmt_nobtf.ko.tmp" "$dst/vmt_nobtf.ko"
	{
		cat "$out/workload.cpio.gz"
		{
			cpio_entry vmt_test.ko $((0100644)) "$ko"
			cpio_entry vmt_nobtf.ko $((0100644)) "$dst/vmt_nobtf.ko"
			# Executable: the workload's `exec N PATH` runs it (ENOEXEC,
			# load_misc_binary called once each).
			cpio_entry binfmt_misc.ko $((0100755)) "$dst/binfmt_misc.ko"
			# Tracepoints of a module (`list -e --qmp`).
			cpio_entry kyber-iosched.ko $((0100644)) "$dst/kyber-iosched.ko"
			cpio_entry TRAILER!!! 0
		} | gzip -9 -n
	} >"$cpio.tmp"
	mv -f "$cpio.tmp" "$cpio"
	echo "guest/build.sh: built $ko and $cpio" >&2
}

# DIR/workload-mod.cpio.gz: the workload initramfs with DIR/binfmt_misc.ko
# (the Debian kernel's own module, unpack_debian_kernel) appended,
# executable (the workload's `exec N PATH` runs it: ENOEXEC, its
# load_misc_binary called once each).
build_workload_with_binfmt_misc() {
	local dir="$1" cpio="$1/workload-mod.cpio.gz"
	build_workload
	if [[ "${FORCE:-0}" != 1 && -f "$cpio" && "$cpio" -nt "$out/workload.cpio.gz" &&
		"$cpio" -nt "$dir/binfmt_misc.ko" ]]; then
		return
	fi
	{
		cat "$out/workload.cpio.gz"
		{
			cpio_entry binfmt_misc.ko $((0100755)) "$dir/binfmt_misc.ko"
			cpio_entry TRAILER!!! 0
		} | gzip -9 -n
	} >"$cpio.tmp"
	mv -f "$cpio.tmp" "$cpio"
}

# DIR/vmt_nobtf.ko: DIR/vmt_test.ko (the 6.12 guest's test module,
# guest/linux/build.sh) without its .BTF, its build id kept, and appended to
# DIR/initramfs.cpio.gz (freshly copied from the cache by every build) as
# /vmt_nobtf.ko: loaded so (vmt_boot.ko=/vmt_nobtf.ko) the guest keeps no
# BTF of it, and `--modules DIR` takes its prototypes from vmt_test.ko's
# DWARF (tests/linux_612.rs). Outside the cached kernel build: its cache key
# stays.
add_vmt_nobtf() {
	local dir="$1"
	objcopy --remove-section=.BTF "$dir/vmt_test.ko" "$dir/vmt_nobtf.ko.tmp"
	mv -f "$dir/vmt_nobtf.ko.tmp" "$dir/vmt_nobtf.ko"
	{
		cat "$dir/initramfs.cpio.gz"
		{
			cpio_entry vmt_nobtf.ko $((0100644)) "$dir/vmt_nobtf.ko"
			cpio_entry TRAILER!!! 0
		} | gzip -9 -n
	} >"$dir/initramfs.cpio.gz.tmp"
	mv -f "$dir/initramfs.cpio.gz.tmp" "$dir/initramfs.cpio.gz"
}

[[ $# -ge 1 ]] || usage
target="$1"
shift
case "$target" in
mini | mini-noftrace | mini-percpu-addr | mini-rethunk)
	build_mini "$target"
	;;
workload)
	build_workload
	;;
linux)
	if [[ -f "$here/linux/build.sh" ]]; then
		exec bash "$here/linux/build.sh" "$@"
	fi
	echo "guest/build.sh: guest/linux/build.sh does not exist (the linux guest is not set up yet)" >&2
	exit 1
	;;
linux-acpi)
	# The default guest with ACPI instead of the MP table: guest/out/linux-acpi/.
	exec bash "$here/linux/build.sh" --variant acpi "$@"
	;;
linux-noftrace)
	# The default guest without ftrace's call sites (no FUNCTION_TRACER):
	# guest/out/linux-noftrace/, traced through direct entries.
	exec bash "$here/linux/build.sh" --variant noftrace "$@"
	;;
linux-6.12)
	if [[ -f "$here/linux/build.sh" ]]; then
		bash "$here/linux/build.sh" --series 6.12 "$@"
		add_vmt_nobtf "${VMTRACE_GUEST_OUT:-$out/linux-6.12}"
		exit 0
	fi
	echo "guest/build.sh: guest/linux/build.sh does not exist (the linux guest is not set up yet)" >&2
	exit 1
	;;
debian-6.12)
	fetch_debian_kernel 6.12 "$DEBIAN_KERNEL_612" "$DEBIAN_SERIES_612"
	;;
vmt-test)
	build_vmt_test
	;;
debian-6.1)
	fetch_debian_kernel 6.1 "$DEBIAN_KERNEL_61" "$DEBIAN_SERIES_61"
	;;
debian-5.10)
	fetch_debian_kernel_by_index 5.10 "$DEBIAN_KERNEL_510" "$DEBIAN_SERIES_510" "$DEBIAN_INDEX_510"
	build_workload_with_binfmt_misc "$out/debian-5.10"
	;;
*)
	usage
	;;
esac
