// Opens an rbscope flame graph page at 1400x1000 in headless Chromium
// driven by puppeteer-core, without scrolling; prints as JSON the
// rendered frames (text, class, data-frames, viewport rectangle), the
// "Show idle threads" box and the idle-samples line, then ticks the box
// and prints the frames again, then clicks the first folded chain and
// prints them once more; takes a screenshot of the first two states.
// Usage: node firstscreen.js PAGE.html BEFORE.png AFTER.png (NODE_PATH: puppeteer-core's node_modules)
const puppeteer = require("puppeteer-core");
(async () => {
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium", headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--user-data-dir=" + process.env.PROFILE_DIR],
  });
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1400, height: 1000 });
    await page.goto("file://" + process.argv[2]);
    const state = () => page.evaluate(() => {
      const rect = (e) => { const r = e.getBoundingClientRect(); return { top: r.top, bottom: r.bottom, left: r.left, width: r.width }; };
      const box = document.getElementById("idle");
      return {
        scrollY: window.scrollY,
        frames: Array.from(document.querySelectorAll("#fg .f")).map((e) => Object.assign(
          { text: e.textContent, cls: e.className, frames: Number(e.dataset.frames || 0) }, rect(e))),
        idleBox: Object.assign({ checked: box.checked, visible: box.offsetParent !== null }, rect(box)),
        idleInfo: document.getElementById("idleinfo").textContent,
      };
    });
    const before = await state();
    await page.screenshot({ path: process.argv[3] });
    // A missing or hidden element is not clicked, and the states say so.
    const click = async (sel) => {
      const e = await page.$(sel);
      if (!e || !(await e.boundingBox())) return;
      await e.click();
    };
    await click("#idle");
    const after = await state();
    await page.screenshot({ path: process.argv[4] });
    await click("#fg .f.chain");
    const expanded = await state();
    console.log(JSON.stringify({ before, after, expanded }));
  } finally {
    await browser.close();
  }
})().catch((e) => { console.error(e); process.exit(1); });
