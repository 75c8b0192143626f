// Open the standalone catapult trace-viewer page made by make_html.py in
// headless Chromium (Playwright), zoom to a window where the vCPU tracks show
// function-entry instant events, and save a screenshot.
// Usage: node shot.js PAGE_HTML OUT_PNG [START_MS END_MS [SELECT_FUNCTION]]
// (NODE_PATH must point at a node_modules holding playwright-core.)
const { chromium } = require('playwright-core');
const path = require('path');

const [pageHtml, outPng, startMs, endMs, select] = process.argv.slice(2);
(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    // Playwright adds --headless and a fresh temporary --user-data-dir itself.
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic',
           '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync'],
  });
  // 1120x640 CSS px at 1.25x -> a 1400x800 PNG with text large enough to read.
  const page = await browser.newPage({ viewport: { width: 1120, height: 640 },
                                       deviceScaleFactor: 1.25 });
  page.on('pageerror', e => console.error('pageerror:', e.message));
  await page.goto('file://' + path.resolve(pageHtml));
  await page.waitForFunction(() => window.__traceLoaded || window.__traceError,
                             null, { timeout: 120000 });
  const err = await page.evaluate(() => window.__traceError);
  if (err) throw new Error('trace import failed: ' + err);

  const info = await page.evaluate(([s, e]) => {
    const viewer = document.getElementById('trace-viewer');
    const model = viewer.model;
    const threads = [];
    for (const p of Object.values(model.processes))
      for (const t of Object.values(p.threads))
        threads.push(`${t.name} (tid ${t.tid}): ${t.instantEvents ? t.instantEvents.length : 0} instants, ${t.sliceGroup.length} zero-length slices`);
    const b = model.bounds;
    return { bounds: [b.min, b.max], threads };
  }, [startMs, endMs]);
  console.log(JSON.stringify(info, null, 1));
  // Let the viewer finish its own initial layout/viewport before zooming.
  await page.waitForTimeout(1500);
  await page.evaluate(([s, e, sel]) => {
    const viewer = document.getElementById('trace-viewer');
    // Zoom to [s, e] ms of model time (the viewer's world unit is ms).
    if (s !== undefined && e !== undefined) {
      // Same calls the viewer's own setInitialViewport_() makes.
      const tv = viewer.trackView;
      const dt = new tr.ui.TimelineDisplayTransform();
      dt.set(tv.viewport.currentDisplayTransform);
      dt.xSetWorldBounds(parseFloat(s), parseFloat(e), tv.modelTrackContainer_.canvas.width);
      tv.viewport.setDisplayTransformImmediately(dt);
      // Select function entries in the window so the analysis panel below the
      // tracks describes them, as clicking (one event) or box-selecting (all)
      // in chrome://tracing would: with `sel`, the first entry of that
      // function (panel shows its name, vCPU, time and args.caller); without,
      // all of them (panel lists names and occurrence counts).
      const picked = new tr.model.EventSet();
      for (const p of Object.values(viewer.model.processes))
        for (const t of Object.values(p.threads))
          for (const sl of t.sliceGroup.slices)
            if (sl.start >= s && sl.start <= e && (!sel || sl.title === sel)) picked.push(sl);
      const chosen = sel ? new tr.model.EventSet(picked.toArray().sort((a, b) => a.start - b.start).slice(0, 1))
                         : picked;
      viewer.brushingStateController.changeSelectionFromTimeline(chosen);
    }
  }, [startMs, endMs, select]);
  await page.waitForTimeout(1000);
  // Drag the divider between the tracks and the analysis panel up, so the
  // panel's table of selected function entries gets the room.
  const handle = await page.evaluate(() => {
    const viewer = document.getElementById('trace-viewer');
    const h = viewer.$$('tr-ui-b-drag-handle');  // Polymer 1 local-DOM query
    if (!h) return null;
    const r = h.getBoundingClientRect();
    return { x: r.x + r.width / 2, y: r.y + r.height / 2 };
  });
  if (handle) {
    await page.mouse.move(handle.x, handle.y);
    await page.mouse.down();
    await page.mouse.move(handle.x, 130, { steps: 10 });
    await page.mouse.up();
  } else {
    console.error('drag handle not found; leaving the layout as is');
  }
  await page.waitForTimeout(1500);
  await page.screenshot({ path: outPng });
  await browser.close();
  console.log('wrote', outPng);
})().catch(e => { console.error(e); process.exit(1); });
