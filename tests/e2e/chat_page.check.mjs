// chat_page.check.mjs — the chat page at GET / in headless Chromium (Debian's, driven by
// playwright-core from tests/npm): system prompt and sampling controls reach the request, streamed
// text fills the assistant bubble, tok/s shows, the stop button cancels the request on the server,
// no console error, no request leaves the server's origin. Writes a screenshot to
// $MOESERVE_PAGE_SHOT (default: the system temp dir; docs/chat_page.png is one such shot).
// Run by run.sh (ctest e2e_chat_page), which skips it without chromium or playwright-core.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { SRC, metrics, sleep, startServer } from './helpers.mjs';

const require = createRequire(path.join(SRC, 'tests/npm/package.json'));
const { chromium } = require('playwright-core');
const CHROMIUM = process.env.MOESERVE_CHROMIUM ?? '/usr/bin/chromium';
const SHOT = process.env.MOESERVE_PAGE_SHOT ?? path.join(os.tmpdir(), 'moeserve_chat_page.png');
const CANCELLED = 'moeserve_generations_total{reason="cancelled"}';

describe('chat page in headless Chromium', () => {
  let srv, browser, page;
  const consoleErrors = [], foreign = [], bodies = [];
  // the route rewrites the next chat request's body (fields the page has no control for), once
  let patchNext = null;

  before(async () => {
    srv = await startServer(['--max-seqs', '4']);
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
    page = await browser.newPage({ viewport: { width: 960, height: 560 } });
    page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
    page.on('pageerror', (e) => consoleErrors.push(String(e)));
    const origin = new URL(srv.url).origin;
    await page.route('**/*', async (route) => {
      const req = route.request();
      if (!req.url().startsWith(origin + '/') && !req.url().startsWith('data:')) {
        foreign.push(req.url());
        return route.abort();
      }
      if (req.url().endsWith('/v1/chat/completions') && req.method() === 'POST') {
        const body = JSON.parse(req.postData());
        bodies.push(body);
        if (patchNext) {
          const patched = { ...body, ...patchNext };
          patchNext = null;
          return route.continue({ postData: JSON.stringify(patched) });
        }
      }
      return route.continue();
    });
    await page.goto(srv.url + '/');
    await page.waitForFunction(() => document.getElementById('model').textContent === 'moeserve-tiny');
  });

  after(async () => {
    await browser?.close();
    const code = await srv?.stop();
    assert.equal(code, 0, `server exit code\n${srv?.stderr()}`);
  });

  test('system prompt and sampling controls are sent; streamed text and tok/s appear', async () => {
    await page.fill('#sys', 'Answer in the words of the King James Bible.');
    await page.fill('#temp', '0.8');
    await page.fill('#topp', '0.9');
    await page.fill('#topk', '40');
    await page.fill('#seed', '7');
    await page.fill('#maxt', '48');
    // the shipped model may end its answer at once; ignore_eos makes the answer 48 tokens long
    patchNext = { ignore_eos: true };
    await page.fill('#q', 'And God said');
    await page.press('#q', 'Enter');
    const meta = page.locator('.assistant .meta').last();
    await meta.filter({ hasText: 'tok/s' }).waitFor({ timeout: 30000 });

    const body = bodies.at(-1);
    assert.deepEqual(body.messages, [
      { role: 'system', content: 'Answer in the words of the King James Bible.' },
      { role: 'user', content: 'And God said' },
    ]);
    assert.equal(body.stream, true);
    assert.equal(body.temperature, 0.8);
    assert.equal(body.top_p, 0.9);
    assert.equal(body.top_k, 40);
    assert.equal(body.seed, 7);
    assert.equal(body.max_tokens, 48);

    const text = await page.locator('.assistant .content').last().textContent();
    assert.ok(text.trim().length > 0 && text !== '(empty answer)', `assistant text: ${JSON.stringify(text)}`);
    assert.match(await meta.textContent(), /^48 tokens, [0-9.]+ s, [0-9.]+ tok\/s$/);
    assert.equal(await page.locator('.user').last().textContent(), 'And God said');
    assert.ok(await page.isEnabled('#send'));
    assert.ok(await page.isDisabled('#stop'));
  });

  test('the stop button aborts the stream and the server cancels the request', async () => {
    const before = (await metrics(srv.url))[CANCELLED] ?? 0;
    await page.fill('#maxt', '900');
    patchNext = { ignore_eos: true };
    await page.fill('#q', 'Tell me more');
    await page.click('#send');
    assert.ok(await page.isEnabled('#stop'), 'stop is enabled while the answer streams');
    const content = page.locator('.assistant .content').last();
    await page.waitForFunction((el) => el.textContent.length > 40, await content.elementHandle());
    // The tiny model writes 900 tokens in about a second: the server is paused while the button is
    // pressed, so the stop surely comes mid-stream.
    process.kill(srv.proc.pid, 'SIGSTOP');
    try {
      await page.click('#stop');
      await page.locator('.assistant .meta').last().filter({ hasText: /^stopped: / }).waitFor({ timeout: 10000 });
    } finally {
      process.kill(srv.proc.pid, 'SIGCONT');
    }
    let cancelled = before;
    for (let i = 0; i < 100 && cancelled === before; i++) {
      await sleep(50);
      cancelled = (await metrics(srv.url))[CANCELLED] ?? 0;
    }
    assert.equal(cancelled, before + 1, `the server counts the request as cancelled\n${srv.stderr()}`);
    assert.match(srv.stderr(), /client gone, cancelled/);
    assert.equal((await metrics(srv.url))['vllm:num_requests_running{model_name="moeserve-tiny"}'], 0);
    assert.ok(await page.isEnabled('#send'));
    assert.ok(await page.isDisabled('#stop'));
    assert.ok(!(await page.locator('.assistant').last().getAttribute('class')).includes('err'));
    await page.screenshot({ path: SHOT });
  });

  test('no console errors, no request outside the server', () => {
    assert.deepEqual(consoleErrors, []);
    assert.deepEqual(foreign, []);
  });
});
