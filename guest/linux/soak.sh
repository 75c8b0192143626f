#!/usr/bin/env bash
# Traced boots of the default Linux guest in a row, each console checked for
# what vmtrace must never cause: an `ftrace bug` (attach raced the guest's
# ftrace_init), a `WARNING:` or a `BUG:` line.
#
#   guest/linux/soak.sh [VMTRACE]   (default: target/release/vmtrace)
#
# Boots: 1, 2 and 4 vCPUs alternating `hrtimer_*` and `*`, ten in all.
# Prints one line per boot and exits non-zero if any console had a complaint.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
vmtrace=${1:-target/release/vmtrace}
out=guest/out
plan=("1 hrtimer_*" "2 *" "4 hrtimer_*" "1 *" "2 hrtimer_*" "4 *" "1 hrtimer_*" "2 *" "4 hrtimer_*" "2 hrtimer_*")
fail=0
for i in "${!plan[@]}"; do
	read -r cpus glob <<<"${plan[$i]}"
	console=$(mktemp /tmp/vmtrace-soak.XXXXXX)
	start=$SECONDS
	"$vmtrace" --kernel $out/bzImage --initrd $out/initramfs.cpio.gz --cpus "$cpus" --mem 96 \
		--timeout 600 --console "$console" --trace "$glob" -o /dev/null --format json 2>"$console.err" || true
	attached=$(grep -o 'attached: [0-9]* sites patched' "$console.err" || echo "not attached")
	bad=$(grep -E 'ftrace bug|WARNING:|BUG:' "$console" || true)
	printf 'boot %2d: %d vCPUs, %-11s %s, %3d s, %s\n' $((i + 1)) "$cpus" "'$glob'" "$attached" $((SECONDS - start)) \
		"$([[ -z $bad ]] && echo "console clean" || echo "CONSOLE: $bad")"
	[[ -z $bad && $attached != "not attached" ]] || { fail=1; cat "$console.err"; }
	rm -f "$console" "$console.err"
done
exit $fail
