// Drags the mouse across the first timeline lane of an rbscope flame
// graph page, from 5% to 30% of its width, in headless Chromium driven by
// puppeteer-core, then prints the flame graph's frames (name=width) and
// the range text as JSON, and takes a screenshot.
// Usage: node drag.js PAGE.html SHOT.png (NODE_PATH: puppeteer-core's node_modules)
const puppeteer = require("puppeteer-core");
(async () => {
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium", headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--user-data-dir=" + process.env.PROFILE_DIR],
  });
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1200, height: 700 });
    await page.goto("file://" + process.argv[2]);
    const box = await (await page.$(".lane-bar")).boundingBox();
    const y = box.y + box.height / 2;
    await page.mouse.move(box.x + box.width * 0.05, y);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * 0.3, y, { steps: 5 });
    await page.mouse.up();
    const frames = await page.$$eval("#fg .f", (es) => es.map((e) => e.textContent + "=" + e.style.width));
    const range = await page.$eval("#range", (e) => e.textContent);
    const sel = await page.$eval("#sel", (e) => e.style.display);
    await page.screenshot({ path: process.argv[3] });
    console.log(JSON.stringify({ frames, range, sel }));
  } finally {
    await browser.close();
  }
})().catch((e) => { console.error(e); process.exit(1); });
