#!/usr/bin/env bash
# Build a test guest into guest/out/.
#
#   bash guest/build.sh mini           -> guest/out/mini.elf
#   bash guest/build.sh mini-noftrace  -> guest/out/mini-noftrace.elf (no ftrace sites)
#   bash guest/build.sh mini-percpu-addr -> guest/out/mini-percpu-addr.elf (per-CPU
#                                      symbols as kernel addresses, as Linux 6.15+)
#   bash guest/build.sh mini-rethunk   -> guest/out/mini-rethunk.elf (returns through
#                                      a counting __x86_return_thunk)
#   bash guest/build.sh linux [ARGS]   -> runs guest/linux/build.sh ARGS
#   bash guest/build.sh linux-acpi [ARGS] -> linux/build.sh --variant acpi ARGS,
#                                      guest/out/linux-acpi/{bzImage,vmlinux,...}
#   bash guest/build.sh linux-6.12 [ARGS] -> the same from linux-source-6.12,
#                                      guest/out/linux-6.12/{bzImage,vmlinux,...}
#
# Environment: CC (default gcc), LD (default ld), FORCE=1 rebuilds even when
# the output is up to date. Safe to run concurrently: each run builds in its
# own temporary directory and renames the result into place.
set -euo pipefail

self="${BASH_SOURCE[0]}"
[[ "$self" == */* ]] || self="./$self"
here="$(cd "${self%/*}" && pwd)"
out="$here/out"
CC="${CC:-gcc}"
LD="${LD:-ld}"

usage() {
	echo "usage: guest/build.sh mini | mini-noftrace | mini-percpu-addr | mini-rethunk | linux | linux-acpi | linux-6.12 [ARGS...]" >&2
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
	"$CC" "${cflags[@]}" -c "$src/workload.c" -o "$tmp/workload.o"
	"$CC" "${cflags[@]}" -c "$src/support.c" -o "$tmp/support.o"
	"$LD" "${MINI_LDFLAGS[@]}" -T "$src/mini.ld" -o "$tmp/mini.elf" \
		"$tmp/entry.o" "$tmp/workload.o" "$tmp/support.o"
	mv -f "$tmp/mini.elf" "$dst"
	echo "guest/build.sh: built guest/out/$name.elf" >&2
}

[[ $# -ge 1 ]] || usage
target="$1"
shift
case "$target" in
mini | mini-noftrace | mini-percpu-addr | mini-rethunk)
	build_mini "$target"
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
linux-6.12)
	if [[ -f "$here/linux/build.sh" ]]; then
		exec bash "$here/linux/build.sh" --series 6.12 "$@"
	fi
	echo "guest/build.sh: guest/linux/build.sh does not exist (the linux guest is not set up yet)" >&2
	exit 1
	;;
*)
	usage
	;;
esac
