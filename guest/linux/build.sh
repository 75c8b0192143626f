#!/usr/bin/env bash
# Build vmtrace's default guest: an ftrace-instrumented Linux 6.1 kernel and a
# tiny initramfs, cached outside the work tree; with --series 6.12 the same
# guest from Debian's linux-source-6.12.
#
#   guest/linux/build.sh [--series 6.1|6.12] [--variant acpi|noftrace] [--force]
#
# Outputs (copied into guest/out/ for 6.1, guest/out/linux-<series>/ for any
# other series, or $VMTRACE_GUEST_OUT):
#   bzImage             the bootable kernel (LZ4-compressed, loads at 16 MiB)
#   vmlinux             the unstripped ELF with symbols and __mcount_loc
#   initramfs.cpio.gz   /init (from init.c) + /dev/console
#   vmt_test.ko         6.12 only: the test module (vmt_test/), built in the
#                       same tree, also in the initramfs as /vmt_test.ko
#
# 6.12 is patched (vmt-boot-6.12.patch): CONFIG_MODULES and a built-in
# loader, kernel/module/vmt_boot.c, that loads /vmt_test.ko at boot through
# the kernel's load_module when the command line says so (vmt_boot.ko=...):
# the guest's user space cannot run in vmtrace's own VMM on this host.
#
# Cache: ${VMTRACE_CACHE_DIR:-~/.cache/vmtrace}/linux-<key>/ where <key> is the
# first 16 hex digits of sha256(linux-source-<series> package version, this
# script, config.fragment (+ config-<series>.fragment if present), init.c, the
# series' patch and the test module, if any). A hit is just a copy. A miss unpacks the Debian
# source once per package version (linux-source-<version>/), builds in one
# object directory per package version (linux-obj-<version>/, so a config
# change rebuilds incrementally), then publishes the outputs with a rename.
# Everything is serialised by a lock; an interrupted run is simply rerun.
#
# --force rebuilds even if the cache has the outputs.
set -euo pipefail

log() { printf '[guest/linux] %s\n' "$*" >&2; }
die() { printf '[guest/linux] ERROR: %s\n' "$*" >&2; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUEST_DIR=$(dirname "$HERE")
CACHE_ROOT=${VMTRACE_CACHE_DIR:-$HOME/.cache/vmtrace}
INIT_SRC=$HERE/init.c
SELF=$HERE/build.sh
OUTPUTS=(bzImage vmlinux initramfs.cpio.gz)
VMT_TEST_DIR=$HERE/vmt_test

FORCE=0
SERIES=6.1
VARIANT=
while (($#)); do
	case $1 in
	--force) FORCE=1 ;;
	--series)
		(($# >= 2)) || die "--series needs a value (6.1 or 6.12)"
		SERIES=$2
		shift
		;;
	--variant)
		(($# >= 2)) || die "--variant needs a value (acpi, noftrace)"
		VARIANT=$2
		shift
		;;
	-h | --help) sed -n '2,30p' "$SELF" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (usage: $0 [--series 6.1|6.12] [--variant acpi|noftrace] [--force])" ;;
	esac
	shift
done
case $SERIES in
6.1 | 6.12) ;;
*) die "unsupported --series $SERIES (supported: 6.1, 6.12)" ;;
esac
SRC_PKG=linux-source-$SERIES
# A series with a patch gets the boot-time module loader and the test module.
PATCH=$HERE/vmt-boot-$SERIES.patch
if [[ -f $PATCH ]]; then
	OUTPUTS+=(vmt_test.ko)
else
	PATCH=
fi
SRC_TARBALL=/usr/src/$SRC_PKG.tar.xz
# 6.1 is the default guest and keeps its historical place, guest/out/.
if [[ $SERIES == 6.1 ]]; then
	OUT_DIR=${VMTRACE_GUEST_OUT:-$GUEST_DIR/out}
else
	OUT_DIR=${VMTRACE_GUEST_OUT:-$GUEST_DIR/out/linux-$SERIES}
fi
# The shared fragment applies to every series; config-<series>.fragment holds
# only what a series needs on top of it (merged last, so it wins).
FRAGMENTS=("$HERE/config.fragment")
[[ -f $HERE/config-$SERIES.fragment ]] && FRAGMENTS+=("$HERE/config-$SERIES.fragment")
# --variant NAME: config-NAME.fragment merged last, outputs in
# guest/out/linux[-<series>]-NAME/, its own object directory (so building it
# does not make the default guest's next build start over).
if [[ -n $VARIANT ]]; then
	[[ $VARIANT =~ ^[a-z0-9]+$ && -f $HERE/config-$VARIANT.fragment ]] ||
		die "unknown --variant $VARIANT (supported: acpi, noftrace)"
	FRAGMENTS+=("$HERE/config-$VARIANT.fragment")
	name=linux-$SERIES-$VARIANT
	[[ $SERIES == 6.1 ]] && name=linux-$VARIANT
	OUT_DIR=${VMTRACE_GUEST_OUT:-$GUEST_DIR/out/$name}
fi

# ---------------------------------------------------------------------------
# Tools and source package. On a fresh (CI) machine, install them when we can.
# ---------------------------------------------------------------------------
TOOLS=(gcc make bc flex bison cpio xz lz4 gzip perl patch sha256sum flock nm readelf objdump strings)
missing_tools() {
	local t
	for t in "${TOOLS[@]}"; do command -v "$t" >/dev/null 2>&1 || printf '%s ' "$t"; done
	[[ -e /usr/include/libelf.h || -e /usr/include/elfutils/libelf.h ]] || printf 'libelf-dev '
	[[ -e /usr/include/openssl/ssl.h ]] || printf 'libssl-dev '
	[[ -e $SRC_TARBALL ]] || printf '%s ' "$SRC_PKG"
}

need=$(missing_tools)
if [[ -n $need ]]; then
	if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		log "missing: $need-> installing with apt-get"
		pkgs=(build-essential bc flex bison cpio xz-utils lz4 gzip perl patch coreutils util-linux
			binutils libelf-dev libssl-dev "$SRC_PKG")
		export DEBIAN_FRONTEND=noninteractive
		if ! apt-get install -y --no-install-recommends "${pkgs[@]}" >&2; then
			apt-get update >&2
			apt-get install -y --no-install-recommends "${pkgs[@]}" >&2
		fi
		need=$(missing_tools)
		[[ -z $need ]] || die "still missing after apt-get install: $need"
	else
		die "missing: $need(run as root on Debian, or: apt-get install -y $SRC_PKG bc flex bison libelf-dev libssl-dev cpio lz4 build-essential)"
	fi
fi

SRC_VERSION=$(dpkg-query -W -f='${Version}' "$SRC_PKG" 2>/dev/null) ||
	die "dpkg-query cannot tell the version of $SRC_PKG"
[[ -n $SRC_VERSION ]] || die "$SRC_PKG has an empty version (not installed?)"
SAFE_VERSION=$(printf '%s' "$SRC_VERSION" | tr -c 'A-Za-z0-9._-' '_')

# ---------------------------------------------------------------------------
# Cache key and lookup.
# ---------------------------------------------------------------------------
KEY=$( {
	printf '%s %s\n' "$SRC_PKG" "$SRC_VERSION"
	for f in "${FRAGMENTS[@]}"; do printf -- '--- %s\n' "${f##*/}"; cat "$f"; done
	printf -- '--- init.c\n'; cat "$INIT_SRC"
	if [[ -n $PATCH ]]; then
		printf -- '--- patch\n'; cat "$PATCH"
		printf -- '--- vmt_test\n'; cat "$VMT_TEST_DIR/vmt_test.c" "$VMT_TEST_DIR/vmt_test_trace.h" "$VMT_TEST_DIR/Kbuild"
	fi
	printf -- '--- build.sh\n'; cat "$SELF"
} | sha256sum | cut -c1-16)
CACHE_DIR=$CACHE_ROOT/linux-$KEY

have_cache() {
	local f
	for f in "${OUTPUTS[@]}"; do [[ -s $CACHE_DIR/$f ]] || return 1; done
}

install_outputs() {
	mkdir -p "$OUT_DIR"
	local f
	for f in "${OUTPUTS[@]}"; do
		cp -f "$CACHE_DIR/$f" "$OUT_DIR/.$f.tmp.$$"
		mv -f "$OUT_DIR/.$f.tmp.$$" "$OUT_DIR/$f"
	done
	log "outputs in $OUT_DIR: ${OUTPUTS[*]} (from $CACHE_DIR)"
	[[ -f $CACHE_DIR/build-info.txt ]] && sed 's/^/[guest\/linux]   /' "$CACHE_DIR/build-info.txt" >&2
	return 0
}

mkdir -p "$CACHE_ROOT"
if [[ $FORCE -eq 0 ]] && have_cache; then
	log "cache hit: linux-$KEY"
	install_outputs
	exit 0
fi

# One build at a time per cache root (they share the source and object dirs).
exec 9>"$CACHE_ROOT/linux.lock"
if ! flock -n 9; then
	log "waiting for another guest/linux build (lock $CACHE_ROOT/linux.lock)"
	flock 9
fi
if [[ $FORCE -eq 0 ]] && have_cache; then # built by whoever held the lock
	log "cache hit: linux-$KEY"
	install_outputs
	exit 0
fi
log "cache miss: building linux-$KEY ($SRC_PKG $SRC_VERSION)"
T0=$SECONDS

# Leftovers of interrupted runs (we hold the lock, so nobody is using them).
rm -rf "$CACHE_ROOT"/.linux-*.tmp.* 2>/dev/null || true

# ---------------------------------------------------------------------------
# Source tree: unpacked once per package version, published by rename.
# ---------------------------------------------------------------------------
SRC_DIR=$CACHE_ROOT/linux-source-$SAFE_VERSION
if [[ ! -f $SRC_DIR/.vmtrace-unpacked ]]; then
	rm -rf "$SRC_DIR"
	tmp=$CACHE_ROOT/.linux-src.tmp.$$
	rm -rf "$tmp"; mkdir -p "$tmp"
	log "unpacking $SRC_TARBALL"
	tar -xJf "$SRC_TARBALL" -C "$tmp"
	top=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d | head -n1)
	[[ -n $top && -f $top/Makefile ]] || die "unexpected layout of $SRC_TARBALL"
	printf '%s\n' "$SRC_VERSION" >"$top/.vmtrace-unpacked"
	mv "$top" "$SRC_DIR"
	rm -rf "$tmp"
fi

# A patched series builds from a copy of the tree that shares the unpacked
# files (hard links; patch(1) writes each file it changes anew, so the pristine
# tree stays as it was), named by the patch's hash, with its own objects.
OBJ_DIR=$CACHE_ROOT/linux-obj-$SAFE_VERSION${VARIANT:+-$VARIANT}
if [[ -n $PATCH ]]; then
	phash=$(sha256sum "$PATCH" | cut -c1-8)
	PATCHED=$SRC_DIR-p$phash
	if [[ ! -f $PATCHED/.vmtrace-patched ]]; then
		rm -rf "$PATCHED"
		tmp=$CACHE_ROOT/.linux-src-p.tmp.$$
		rm -rf "$tmp"
		log "patching a linked copy of $SRC_DIR with ${PATCH##*/}"
		cp -al "$SRC_DIR" "$tmp"
		rm -f "$tmp/.vmtrace-unpacked"
		patch -s -p1 -d "$tmp" <"$PATCH" || die "${PATCH##*/} does not apply to $SRC_DIR"
		printf '%s\n' "$SRC_VERSION ${PATCH##*/}" >"$tmp/.vmtrace-patched"
		mv "$tmp" "$PATCHED"
	fi
	SRC_DIR=$PATCHED
	OBJ_DIR=$OBJ_DIR-p$phash
fi

# ---------------------------------------------------------------------------
# Configure: tinyconfig + fragment, then check the fragment survived.
# ---------------------------------------------------------------------------
mkdir -p "$OBJ_DIR"
# Fixed build stamps: the same inputs give the same vmlinux (and build id).
export KBUILD_BUILD_USER=vmtrace KBUILD_BUILD_HOST=vmtrace KBUILD_BUILD_VERSION=1
export KBUILD_BUILD_TIMESTAMP="debian-$SRC_VERSION-$KEY"
KMAKE=(make -C "$SRC_DIR" O="$OBJ_DIR" ARCH=x86_64)
JOBS=$(nproc 2>/dev/null || echo 2)

log "configuring: tinyconfig + ${FRAGMENTS[*]##*/}"
"${KMAKE[@]}" -s tinyconfig >"$OBJ_DIR/config.log" 2>&1 ||
	{ tail -n 40 "$OBJ_DIR/config.log" >&2; die "make tinyconfig failed"; }
(cd "$OBJ_DIR" && "$SRC_DIR/scripts/kconfig/merge_config.sh" -m -O "$OBJ_DIR" \
	"$OBJ_DIR/.config" "${FRAGMENTS[@]}") >>"$OBJ_DIR/config.log" 2>&1 ||
	{ tail -n 40 "$OBJ_DIR/config.log" >&2; die "merge_config.sh failed"; }
"${KMAKE[@]}" -s olddefconfig >>"$OBJ_DIR/config.log" 2>&1 ||
	{ tail -n 40 "$OBJ_DIR/config.log" >&2; die "make olddefconfig failed"; }

bad=()
while IFS= read -r line; do
	if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
		sym=${BASH_REMATCH[1]}
		grep -qxF -- "$line" "$OBJ_DIR/.config" ||
			bad+=("$sym: wanted '${BASH_REMATCH[2]}', got '$(grep -E "^(# )?$sym[= ]" "$OBJ_DIR/.config" || echo absent)'")
	elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
		sym=${BASH_REMATCH[1]}
		if grep -qE "^$sym=" "$OBJ_DIR/.config"; then
			bad+=("$sym: wanted off, got '$(grep -E "^$sym=" "$OBJ_DIR/.config")'")
		fi
	fi
done < <(
	# The last fragment that mentions an option decides it (merge_config.sh's rule).
	awk '($0 ~ /^CONFIG_/ || $0 ~ /^# CONFIG_[A-Za-z0-9_]+ is not set$/) && match($0, /CONFIG_[A-Za-z0-9_]+/) {
		s = substr($0, RSTART, RLENGTH); if (!(s in v)) o[++n] = s; v[s] = $0
	} END { for (i = 1; i <= n; i++) print v[o[i]] }' "${FRAGMENTS[@]}"
)
if ((${#bad[@]})); then
	for b in "${bad[@]}"; do log "config mismatch: $b"; done
	die "${#bad[@]} option(s) of ${FRAGMENTS[*]##*/} did not survive olddefconfig (dependencies?); see $OBJ_DIR/.config"
fi
log "config OK ($(grep -c '=y$' "$OBJ_DIR/.config") options =y)"

# ---------------------------------------------------------------------------
# Build bzImage. The full log goes to build.log; the console gets errors and
# one progress line every 30 s.
# ---------------------------------------------------------------------------
BUILD_LOG=$OBJ_DIR/build.log
log "make -j$JOBS bzImage (log: $BUILD_LOG)"
T1=$SECONDS
set +e
"${KMAKE[@]}" -j"$JOBS" bzImage 2>&1 | tee "$BUILD_LOG" | {
	n=0; cc=0; last=$SECONDS
	while IFS= read -r l; do
		n=$((n + 1))
		case $l in
		"  CC "*) cc=$((cc + 1)) ;;
		*error:* | *Error\ [0-9]* | *"*** "*) printf '[guest/linux] %s\n' "$l" >&2 ;;
		esac
		if ((SECONDS - last >= 30)); then
			last=$SECONDS
			printf '[guest/linux] %4ds: %d objects compiled, at: %s\n' \
				$((SECONDS - T1)) "$cc" "${l:0:100}" >&2
		fi
	done
	printf '[guest/linux] %4ds: make finished, %d objects compiled\n' $((SECONDS - T1)) "$cc" >&2
}
rc=${PIPESTATUS[0]}
set -e
if ((rc != 0)); then
	tail -n 40 "$BUILD_LOG" >&2
	die "kernel build failed (exit $rc); full log: $BUILD_LOG"
fi
BUILD_SECS=$((SECONDS - T1))

VMLINUX=$OBJ_DIR/vmlinux
BZIMAGE=$OBJ_DIR/arch/x86/boot/bzImage
[[ -s $VMLINUX && -s $BZIMAGE ]] || die "make succeeded but vmlinux or bzImage is missing"

# ftrace patch-site table: __start_mcount_loc..__stop_mcount_loc, 8 bytes each.
sym_addr() { nm "$VMLINUX" | awk -v s="$1" '$3 == s && !found { print $1; found = 1 }'; }
start=$(sym_addr __start_mcount_loc)
stop=$(sym_addr __stop_mcount_loc)
if [[ $VARIANT == noftrace ]]; then
	# Built to have none: vmtrace traces it through direct entries.
	[[ -z $start && -z $stop ]] || die "the noftrace variant has __mcount_loc (FUNCTION_TRACER still on?)"
	SITES=0
else
	[[ -n $start && -n $stop ]] || die "vmlinux has no __start_mcount_loc/__stop_mcount_loc (FUNCTION_TRACER/DYNAMIC_FTRACE off?)"
	SITES=$(((16#$stop - 16#$start) / 8))
	((SITES >= 1000)) || die "only $SITES ftrace sites in vmlinux (expected thousands)"
fi
KVER=$(strings -n 20 "$VMLINUX" | grep '^Linux version ' | head -n1 || true)

# ---------------------------------------------------------------------------
# The test module, built against this tree: `make modules` first writes the
# Module.symvers an external module links against (the kernel has no modules
# of its own).
# ---------------------------------------------------------------------------
if [[ -n $PATCH ]]; then
	log "building vmt_test.ko against this tree"
	"${KMAKE[@]}" -j"$JOBS" modules >>"$BUILD_LOG" 2>&1 ||
		{ tail -n 40 "$BUILD_LOG" >&2; die "make modules failed"; }
	MOD_TMP=$OBJ_DIR/.vmt_test.tmp
	rm -rf "$MOD_TMP"; mkdir -p "$MOD_TMP"
	cp "$VMT_TEST_DIR/vmt_test.c" "$VMT_TEST_DIR/vmt_test_trace.h" "$VMT_TEST_DIR/Kbuild" "$MOD_TMP/"
	"${KMAKE[@]}" M="$MOD_TMP" modules >>"$BUILD_LOG" 2>&1 ||
		{ tail -n 40 "$BUILD_LOG" >&2; die "building vmt_test.ko failed"; }
fi

# ---------------------------------------------------------------------------
# initramfs: /init (static, no libc) + /dev/console via the kernel's
# gen_init_cpio, so no device node has to exist on the host.
# ---------------------------------------------------------------------------
STAGE=$CACHE_ROOT/.linux-$KEY.tmp.$$
rm -rf "$STAGE"; mkdir -p "$STAGE"
gcc -Os -static -nostdlib -ffreestanding -fno-pie -no-pie -fno-stack-protector \
	-fno-asynchronous-unwind-tables -fcf-protection=none -Wall -Wextra \
	-Wl,--build-id=none -o "$STAGE/init" "$INIT_SRC" ||
	die "cannot build /init from $INIT_SRC"
touch -d @0 "$STAGE/init"
gcc -O2 -o "$STAGE/gen_init_cpio" "$SRC_DIR/usr/gen_init_cpio.c" ||
	die "cannot build gen_init_cpio"
cat >"$STAGE/initramfs.list" <<EOF
dir /dev 0755 0 0
nod /dev/console 0600 0 0 c 5 1
dir /proc 0755 0 0
dir /sys 0755 0 0
dir /root 0700 0 0
file /init $STAGE/init 0755 0 0
EOF
if [[ -n $PATCH ]]; then
	cp "$MOD_TMP/vmt_test.ko" "$STAGE/vmt_test.ko"
	touch -d @0 "$STAGE/vmt_test.ko"
	printf 'file /vmt_test.ko %s 0644 0 0\n' "$STAGE/vmt_test.ko" >>"$STAGE/initramfs.list"
fi
"$STAGE/gen_init_cpio" -t 0 "$STAGE/initramfs.list" | gzip -9 -n >"$STAGE/initramfs.cpio.gz"
rm -f "$STAGE/gen_init_cpio"

# ---------------------------------------------------------------------------
# Publish: stage everything, then one rename into the cache.
# ---------------------------------------------------------------------------
cp "$BZIMAGE" "$STAGE/bzImage"
cp "$VMLINUX" "$STAGE/vmlinux"
cp "$OBJ_DIR/System.map" "$STAGE/System.map"
cp "$OBJ_DIR/.config" "$STAGE/config"
cat >"$STAGE/build-info.txt" <<EOF
key:            $KEY
source:         $SRC_PKG $SRC_VERSION
kernel:         $KVER
compiler:       $(gcc --version | head -n1)
bzImage bytes:  $(stat -c %s "$STAGE/bzImage")
vmlinux bytes:  $(stat -c %s "$STAGE/vmlinux")
ftrace sites:   $SITES (__start_mcount_loc=0x$start __stop_mcount_loc=0x$stop)
make seconds:   $BUILD_SECS (-j$JOBS)
built:          $(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
rm -rf "$CACHE_DIR"
mv "$STAGE" "$CACHE_DIR"
log "built linux-$KEY in $((SECONDS - T0)) s"
install_outputs
