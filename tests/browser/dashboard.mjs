// End-to-end test of the `stepwell serve` dashboard in a real, headless Chromium.
//
// Env: STEPWELL_URL (base URL), STEPWELL_TOKEN, STEPWELL_REPO (repo root),
// STEPWELL_SCREENSHOTS (dir), STEPWELL_AUTOMATION_ID (an active scheduled automation),
// STEPWELL_ASKING_AUTOMATION_ID (one whose occurrence waits on a person),
// STEPWELL_WORKSPACE (writable dir for the tool-approval run), optional CHROMIUM
// (default /usr/bin/chromium) and STEPWELL_NODE_MODULES (where playwright-core is installed,
// default <repo>/target/browser/node_modules).
//
// Prints one line per step; exits 0 when every step passed, else prints what failed,
// saves failure.png and exits 1.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined || v === '') {
    console.error(`missing environment variable ${name}`);
    process.exit(2);
  }
  return v;
};
const REPO = env('STEPWELL_REPO', path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..'));
const BASE = env('STEPWELL_URL').replace(/\/+$/, '');
const TOKEN = env('STEPWELL_TOKEN');
const SHOTS = env('STEPWELL_SCREENSHOTS');
const AUTOMATION_ID = env('STEPWELL_AUTOMATION_ID');
const ASKING_ID = env('STEPWELL_ASKING_AUTOMATION_ID');
const WORKSPACE = env('STEPWELL_WORKSPACE');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const MODULES = process.env.STEPWELL_NODE_MODULES || path.join(REPO, 'target/browser/node_modules');
const TIMEOUT = 20_000;

const require = createRequire(path.join(MODULES, 'noop.js'));
const { chromium } = require('playwright-core');

fs.mkdirSync(SHOTS, { recursive: true });
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'stepwell-dash-profile-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: CHROMIUM,
  headless: true,
  viewport: { width: 1360, height: 900 },
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
context.setDefaultTimeout(TIMEOUT);
const page = context.pages()[0] || (await context.newPage());

// What the page did wrong along the way: uncaught errors, console errors, requests elsewhere.
const problems = [];
page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
// (A refused token and a rejected command are expected answers, not errors of the page.)
page.on('console', (m) => {
  // (Failed responses are reported with their URL below.)
  if (m.type() === 'error' && !/^Failed to load resource/.test(m.text())) problems.push(`console error: ${m.text()}`);
});
page.on('response', (r) => {
  if (r.status() >= 400 && ![401, 422].includes(r.status())) problems.push(`HTTP ${r.status()} ${r.request().method()} ${r.url()}`);
});
page.on('request', (r) => {
  const u = r.url();
  if (!u.startsWith(BASE + '/') && !u.startsWith('data:')) problems.push(`request outside the server: ${u}`);
});

const tid = (id) => `[data-testid="${id}"]`;
let shot = 0;
async function screenshot(name) {
  shot += 1;
  const file = path.join(SHOTS, `${String(shot).padStart(2, '0')}-${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  return path.basename(file);
}
let current = '';
async function step(name, fn) {
  current = name;
  const t0 = Date.now();
  const detail = await fn();
  console.log(`ok  ${name} (${Date.now() - t0} ms)${detail ? ' ' + detail : ''}`);
}
const expectText = (selector, text) => page.waitForFunction(
  ([sel, want]) => [...document.querySelectorAll(sel)].some((e) => e.textContent.includes(want)),
  [selector, text], { timeout: TIMEOUT });
const runStatus = (status) => page.waitForFunction(
  (want) => document.querySelector('[data-testid="run-status"]')?.textContent.trim() === want,
  status, { timeout: TIMEOUT });
function runIdFromUrl() {
  const m = /#\/runs\/([^/?]+)$/.exec(page.url());
  if (!m) throw new Error(`not on a run page: ${page.url()}`);
  return decodeURIComponent(m[1]);
}
async function startRun(bundle, vars) {
  await page.goto(`${BASE}/#/runs`);
  await page.locator(tid('runs-page')).waitFor();
  const form = page.locator(tid('start-form'));
  if (!(await form.evaluate((d) => d.open))) await form.locator('summary').click();
  await page.locator(tid('start-kind')).selectOption('bundle');
  await page.locator(tid('start-bundle')).fill(bundle);
  await page.locator(tid('start-vars')).fill(JSON.stringify(vars));
  await page.locator(tid('start-submit')).click();
  await page.waitForURL(/#\/runs\/[^/]+$/);
  await page.locator(tid('run-page')).waitFor();
  return runIdFromUrl();
}

// Waits until each named button is enabled (true) or disabled (false).
const buttons = (want) => page.waitForFunction((w) => Object.entries(w).every(([id, on]) => {
  const b = document.querySelector(`[data-testid="${id}"]`);
  return b && b.disabled === !on;
}), want, { timeout: TIMEOUT });
// The rows of the runs table, once the list shows them.
const rows = () => page.evaluate(() => [...document.querySelectorAll('[data-testid="run-row"]')]
  .map((r) => ({ id: r.dataset.runId, workflow: r.dataset.workflow, status: r.dataset.status })));
const nodeStates = () => page.evaluate(() => Object.fromEntries([...document.querySelectorAll('[data-testid="flow-node"]')]
  .map((n) => [n.dataset.node, n.dataset.state])));
// A table as wide as its card at most (it would scroll inside it).
async function tableFits(testid) {
  const [inner, outer] = await page.evaluate((t) => {
    const wrap = document.querySelector(`[data-testid="${t}"]`).parentElement;
    return [wrap.scrollWidth, wrap.clientWidth];
  }, testid);
  if (inner > outer + 1) throw new Error(`${testid} is ${inner} px wide in a ${outer} px card`);
}
// A duration as the page writes one, above zero ("under 1 ms" is not).
const DURATION = /\d+(\.\d)? (ms|s)|\d+ (min|h|d)/;
const measured = (t) => DURATION.test(t) && !t.includes('under');
async function fitsTheScreen(what) {
  const [doc, win] = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
  if (doc > win + 1) throw new Error(`${what} is ${doc} px wide on a ${win} px screen`);
}

const runs = {};
try {
  await step('a. the shell asks for the token and shows no data', async () => {
    await page.goto(`${BASE}/`);
    await page.locator(tid('token-input')).waitFor();
    if (await page.locator(`${tid('run-row')}, ${tid('runs-page')}`).count()) throw new Error('data shown before sign-in');
    if (await page.locator('#app').isVisible()) throw new Error('the app section is visible before sign-in');
    const a = await screenshot('token');
    await page.locator(tid('token-input')).fill('not-the-token-0000000000');
    await page.locator(tid('token-submit')).click();
    await expectText(tid('token-error'), '401');
    await page.locator(tid('token-input')).fill(TOKEN);
    await page.locator(tid('token-submit')).click();
    await page.locator(tid('runs-page')).waitFor();
    await page.waitForFunction(() => document.querySelector('[data-testid="live"]')?.dataset.state === 'live', null, { timeout: TIMEOUT });
    const b = await screenshot('runs');
    return `(a wrong token is refused; ${a}, ${b})`;
  });

  await step('b. ask-user: start, answer "Ada", completed live', async () => {
    const id = await startRun(path.join(REPO, 'flows/examples/ask-user'), {});
    runs.ask = id;
    await runStatus('waiting');
    await expectText(tid('wait-prompt'), 'What is your name?');
    await page.locator(tid('timeline-record')).first().waitFor();
    await page.evaluate(() => { window.__stepwellNoReload = true; });
    const a = await screenshot('ask-waiting');
    const before = await page.locator(tid('timeline-record')).count();
    await page.locator(tid('answer-input')).fill('Ada');
    await page.locator(tid('answer-submit')).click();
    await runStatus('completed');
    await expectText(tid('run-output'), 'Hello, Ada!');
    // The new ledger records arrive over the live stream.
    await page.waitForFunction((n) => document.querySelectorAll('[data-testid="timeline-record"]').length > n, before, { timeout: TIMEOUT });
    if (!(await page.evaluate(() => window.__stepwellNoReload === true))) throw new Error('the page reloaded');
    if (await page.locator(tid('wait-panel')).count()) throw new Error('the wait panel is still shown');
    const b = await screenshot('ask-completed');
    return `(run ${id}; ${a}, ${b})`;
  });

  await step('c. write-note: approve write_file, completed, the file is written', async () => {
    const note = path.join(WORKSPACE, 'note.txt');
    fs.rmSync(note, { force: true });
    const id = await startRun(path.join(REPO, 'flows/examples/write-note'), { workspace_root: WORKSPACE, note: 'from the browser' });
    runs.note = id;
    await runStatus('waiting');
    await page.locator(`${tid('tool-call')}[data-tool="write_file"]`).waitFor();
    await expectText(tid('tool-call'), 'from the browser');
    await page.evaluate(() => { window.__stepwellNoReload = true; });
    const a = await screenshot('tool-approval');
    await page.locator(tid('approve')).click();
    await runStatus('completed');
    if (!(await page.evaluate(() => window.__stepwellNoReload === true))) throw new Error('the page reloaded');
    const b = await screenshot('tool-approved');
    const text = fs.readFileSync(note, 'utf8');
    if (!text.includes('from the browser')) throw new Error(`${note} holds ${JSON.stringify(text)}`);
    return `(run ${id}; ${note} written; ${a}, ${b})`;
  });

  await step('d. automation: pause, then resume', async () => {
    await page.goto(`${BASE}/#/automations`);
    const row = page.locator(`${tid('automation-row')}[data-automation-id="${AUTOMATION_ID}"]`);
    await row.waitFor();
    await expectText(tid('automation-row'), 'webhook.received@1 · connection tc_');
    await fitsTheScreen('the automations, one with a webhook trigger,');
    await tableFits('automations-table');
    const a = await screenshot('automations');
    await row.click();
    await page.waitForURL(new RegExp(`#/automations/${AUTOMATION_ID}$`));
    await expectText(tid('automation-status'), 'active');
    await page.locator(`${tid('occurrences')} h2`).waitFor();
    const b = await screenshot('automation');
    // The buttons follow the state: only what can apply now is enabled.
    await buttons({ 'cmd-pause': true, 'cmd-resume': false, 'cmd-run-now': true, 'cmd-stop-current': false });
    await page.locator(tid('cmd-pause')).click();
    await expectText(tid('cmd-result'), 'applied');
    await expectText(tid('automation-status'), 'paused');
    await buttons({ 'cmd-pause': false, 'cmd-resume': true, 'cmd-run-now': true, 'cmd-stop-current': false });
    const c = await screenshot('automation-paused');
    await page.locator(tid('cmd-resume')).click();
    await expectText(tid('automation-status'), 'active');
    await buttons({ 'cmd-pause': true, 'cmd-resume': false });
    const d = await screenshot('automation-resumed');
    return `(pause/resume/stop current enabled as the state allows; ${a}, ${b}, ${c}, ${d})`;
  });

  await step('e. waits page (answered from there), runs page filtered to completed', async () => {
    // A run waiting on a person, so the waits page has something to show; answered through its link.
    const id = await startRun(path.join(REPO, 'flows/examples/ask-user'), {});
    runs.waits = id;
    await runStatus('waiting');
    await page.goto(`${BASE}/#/waits`);
    const item = page.locator(`${tid('wait-item')}[data-run-id="${id}"]`);
    await item.waitFor();
    await expectText(tid('wait-item'), 'What is your name?');
    const a = await screenshot('waits');
    await item.locator(tid('wait-open')).click();
    await page.waitForURL(new RegExp(`#/runs/${id}$`));
    await page.locator(tid('answer-input')).fill('Grace');
    await page.locator(tid('answer-submit')).click();
    await runStatus('completed');
    await expectText(tid('run-output'), 'Hello, Grace!');
    await page.goto(`${BASE}/#/runs`);
    await page.locator(tid('runs-table')).waitFor();
    await page.locator(tid('filter-completed')).click();
    await page.waitForFunction((ids) => {
      const rows = [...document.querySelectorAll('[data-testid="run-row"]')];
      return rows.length > 0 && rows.every((r) => r.dataset.status === 'completed') &&
        ids.every((id) => rows.some((r) => r.dataset.runId === id));
    }, [runs.ask, runs.note, runs.waits], { timeout: TIMEOUT });
    const b = await screenshot('runs-completed');
    return `(${a}, ${b})`;
  });

  await step('f. workflows page: ask-user deployed, its versions with their runs', async () => {
    await page.locator(tid('nav-workflows')).click();
    await page.waitForURL(/#\/workflows$/);
    const row = page.locator(tid('workflow-row'), { hasText: 'ask-user' });
    await row.waitFor();
    const a = await screenshot('workflows');
    await row.locator('a').click();
    await page.waitForURL(/#\/workflows\/ask-user$/);
    await page.locator(tid('version-row')).first().waitFor();
    await expectText(tid('versions'), 'completed');
    const b = await screenshot('workflow-versions');
    return `(${a}, ${b})`;
  });

  await step('g. fork: the ask-user run forked from its greet with another name', async () => {
    await page.goto(`${BASE}/#/runs/${encodeURIComponent(runs.ask)}`);
    const fork = page.locator(`${tid('fork')}[data-seq="4"]`);
    await fork.waitFor({ timeout: TIMEOUT });
    const a = await screenshot('fork-offered');
    page.once('dialog', (d) => d.accept('{"user_input": {"text": "Grace"}}'));
    await fork.click();
    await page.waitForFunction((src) => /#\/runs\/[^/]+$/.test(location.hash) && !location.hash.includes(src), runs.ask, { timeout: TIMEOUT });
    await page.locator(tid('forked-from')).waitFor({ timeout: TIMEOUT });
    await runStatus('completed');
    await expectText(tid('run-output'), 'Hello, Grace!');
    await expectText(tid('forked-from'), 'record #4');
    const b = await screenshot('forked');
    return `(${a}, ${b})`;
  });

  await step('h. runs filters: workflow, time, run id; kept in the address', async () => {
    await page.goto(`${BASE}/#/runs`);
    await page.locator(tid('runs-table')).waitFor();
    await page.locator(tid('filter-workflow')).fill('ask-user');
    await page.locator(tid('filter-workflow')).press('Tab');
    const asked = page.waitForRequest((r) => /\/v1\/runs\?/.test(r.url()) && /workflow_id=ask-user/.test(r.url()) && /since=\d{4}-/.test(r.url()));
    await page.locator(tid('filter-since')).selectOption('1h');
    const since = new URL((await asked).url()).searchParams.get('since');
    const back = (Date.now() - Date.parse(since)) / 60000;
    if (back < 59 || back > 61) throw new Error(`"last hour" asked for runs since ${since}, ${back.toFixed(1)} min back`);
    const want = [runs.ask, runs.waits];
    const filtered = () => page.waitForFunction((ids) => {
      const r = [...document.querySelectorAll('[data-testid="run-row"]')];
      return r.length > 0 && r.every((x) => x.dataset.workflow === 'ask-user') && ids.every((id) => r.some((x) => x.dataset.runId === id));
    }, want, { timeout: TIMEOUT });
    await filtered();
    if ((await rows()).some((r) => r.id === runs.note)) throw new Error('the write-note run is listed under ask-user');
    if (!/workflow=ask-user/.test(page.url()) || !/since=1h/.test(page.url())) throw new Error(`the filters are not in the address: ${page.url()}`);
    await page.reload();
    await filtered();
    if ((await page.locator(tid('filter-workflow')).inputValue()) !== 'ask-user') throw new Error('the workflow filter was lost on reload');
    if ((await page.locator(tid('filter-since')).inputValue()) !== '1h') throw new Error('the time filter was lost on reload');
    const took = await page.locator(`${tid('run-row')}[data-status="completed"] ${tid('run-took')}`).allTextContents();
    if (!took.some(measured)) throw new Error(`no completed run shows a duration: ${JSON.stringify(took)}`);
    const a = await screenshot('runs-filtered');
    // A window in the past holds nothing.
    await page.locator(tid('filter-since')).selectOption('custom');
    await page.locator(tid('filter-from')).fill('2000-01-01T00:00');
    await page.locator(tid('filter-to')).fill('2000-01-02T00:00');
    await page.locator(tid('empty')).waitFor();
    if (await page.locator(tid('run-row')).count()) throw new Error('runs listed in a window of 2000');
    // A run found by its id.
    await page.locator(tid('find-run')).fill(runs.note);
    await page.locator(tid('find-submit')).click();
    await page.waitForURL(new RegExp(`#/runs/${runs.note}$`));
    return `(ask-user in the last hour: ${(await rows()).length || 'the'} rows; ${a})`;
  });

  await step('i. a run: its flow picture, input apart from vars, durations', async () => {
    await page.goto(`${BASE}/#/runs/${encodeURIComponent(runs.note)}`);
    await page.locator(`${tid('flow')} ${tid('flow-node')}`).first().waitFor();
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="flow-node"][data-state="visited"]').length === 2, null, { timeout: TIMEOUT });
    const states = await nodeStates();
    if (states.write !== 'visited' || states.done !== 'visited') throw new Error(`write-note's nodes: ${JSON.stringify(states)}`);
    if (!(await page.locator(`${tid('flow-edge')}[data-from="write"][data-to="done"][data-taken="yes"]`).count())) throw new Error('the move write → done is not drawn as taken');
    await expectText(tid('run-input'), 'from the browser');
    const vars = await page.locator(tid('run-vars')).textContent();
    if (!vars.includes('written')) throw new Error('the vars do not show what the run wrote');
    if ((await page.locator(tid('run-input')).textContent()).includes('"written"')) throw new Error('the input shows a var the run wrote later');
    const n = await page.locator(tid('timeline-record')).count();
    const steps = await page.locator(tid('step-took')).allTextContents();
    if (steps.length !== n) throw new Error(`${steps.length} durations for ${n} records`);
    // The approval took a while: the record after it says how long.
    if (!steps.some(measured)) throw new Error(`no step took measurable time: ${JSON.stringify(steps)}`);
    const runTook = await page.locator(tid('run-took')).textContent();
    if (!measured(runTook)) throw new Error(`the run's duration reads ${JSON.stringify(runTook)}`);
    const a = await screenshot('run-flow');
    // A waiting run: its current node stands out.
    const id = await startRun(path.join(REPO, 'flows/examples/ask-user'), {});
    runs.open = id;
    await runStatus('waiting');
    await page.waitForFunction(() => document.querySelector('[data-testid="flow-node"][data-node="ask"]')?.dataset.state === 'current', null, { timeout: TIMEOUT });
    if ((await nodeStates()).greet !== 'idle') throw new Error(`greet is ${(await nodeStates()).greet} before it ran`);
    const b = await screenshot('run-waiting-flow');
    return `(write and done visited, ask current, greet not reached; ${a}, ${b})`;
  });

  await step('j. a parent links its child, the child its parent', async () => {
    const id = await startRun(path.join(REPO, 'flows/examples/subworkflow'), { text: 'from the browser' });
    runs.parent = id;
    await runStatus('completed');
    const child = page.locator(`${tid('child-runs')} ${tid('child-row')}`);
    await child.first().waitFor();
    const childId = await child.first().getAttribute('data-run-id');
    runs.child = childId;
    const inTimeline = page.locator(tid('child-link'));
    await inTimeline.first().waitFor();
    if (!(await inTimeline.first().getAttribute('href')).includes(childId)) throw new Error('the timeline links another run');
    const a = await screenshot('parent');
    await child.first().locator('a').first().click();
    await page.waitForURL(new RegExp(`#/runs/${childId}$`));
    await runStatus('completed');
    await expectText(tid('run-output'), 'FROM THE BROWSER');
    await page.locator(`a[href="#/runs/${id}"]`).first().click();
    await page.waitForURL(new RegExp(`#/runs/${id}$`));
    await page.locator(tid('child-runs')).waitFor();
    return `(child ${childId}; ${a})`;
  });

  await step('k. an automation controller reads as what it did', async () => {
    await page.goto(`${BASE}/#/runs/${AUTOMATION_ID}`);
    await page.locator(`${tid('activity-item')}[data-kind="created"]`).waitFor();
    await page.locator(`${tid('flow-node')}[data-node="wait"]`).waitFor();
    if (await page.locator(tid('timeline')).isVisible()) throw new Error('the raw records are shown before they are asked for');
    const kinds = await page.evaluate(() => [...document.querySelectorAll('[data-testid="activity-item"]')].map((i) => i.dataset.kind));
    const records = await page.locator(tid('timeline-record')).count();
    if (kinds.length * 2 > records) throw new Error(`${kinds.length} activity lines for ${records} records`);
    for (const k of ['created', 'admitted', 'dispatched', 'completed', 'paused', 'resumed']) {
      if (!kinds.includes(k)) throw new Error(`no "${k}" line among ${JSON.stringify(kinds)}`);
    }
    const a = await screenshot('controller');
    await page.locator(tid('show-raw')).check();
    await page.locator(tid('timeline')).waitFor();
    // The occurrence's line links its run, whose page links back.
    const occ = page.locator(`${tid('activity-item')}[data-kind="dispatched"] ${tid('child-link')}`).first();
    const href = await occ.getAttribute('href');
    if (!/^#\/runs\/[0-9a-f-]{36}$/.test(href)) throw new Error(`the occurrence links ${href}`);
    await occ.click();
    await page.waitForURL(new RegExp(href.replace(/[/]/g, '\\/') + '$'));
    await runStatus('completed');
    await page.locator(`a[href="#/automations/${AUTOMATION_ID}"]`).first().waitFor();
    return `(${kinds.length} lines for ${records} records: ${[...new Set(kinds)].join(', ')}; ${a})`;
  });

  await step('k2. an occurrence in flight: Stop current on, Run now off', async () => {
    await page.goto(`${BASE}/#/automations/${ASKING_ID}`);
    await page.locator(tid('automation-wait')).waitFor();
    await buttons({ 'cmd-stop-current': true, 'cmd-run-now': false, 'cmd-pause': true, 'cmd-resume': false });
    const why = await page.locator(tid('cmd-run-now')).getAttribute('title');
    if (!/in flight/.test(why || '')) throw new Error(`run now, disabled, says ${JSON.stringify(why)}`);
    await page.locator(tid('cmd-stop-current')).click();
    await expectText(tid('cmd-result'), 'applied');
    await buttons({ 'cmd-stop-current': false, 'cmd-run-now': true });
    return '(then stopped: Stop current off, Run now on)';
  });

  await step('l. a phone (390 px): the same pages fit the screen', async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    const shots = [];
    await page.goto(`${BASE}/#/runs?workflow=ask-user&since=24h`);
    await page.locator(tid('run-row')).first().waitFor();
    await fitsTheScreen('the runs page');
    shots.push(await screenshot('phone-runs'));
    await page.goto(`${BASE}/#/runs/${encodeURIComponent(runs.open)}`);
    await page.locator(tid('flow-node')).first().waitFor();
    await page.locator(tid('answer-input')).waitFor();
    await fitsTheScreen('a waiting run');
    shots.push(await screenshot('phone-run'));
    await page.goto(`${BASE}/#/runs/${encodeURIComponent(runs.parent)}`);
    await page.locator(tid('child-row')).first().waitFor();
    await fitsTheScreen('a parent run');
    shots.push(await screenshot('phone-parent'));
    await page.goto(`${BASE}/#/automations`);
    await page.locator(tid('automation-row')).first().waitFor();
    await fitsTheScreen('the automations');
    shots.push(await screenshot('phone-automations'));
    await page.goto(`${BASE}/#/automations/${AUTOMATION_ID}`);
    await page.locator(`${tid('occurrences')} h2`).waitFor();
    await fitsTheScreen('an automation');
    shots.push(await screenshot('phone-automation'));
    await page.setViewportSize({ width: 1360, height: 900 });
    return `(${shots.join(', ')})`;
  });

  if (problems.length) {
    current = 'no page errors, no outside requests';
    throw new Error(problems.join('\n'));
  }
  console.log('PASS: every step passed');
  await context.close();
  fs.rmSync(profile, { recursive: true, force: true });
  process.exit(0);
} catch (e) {
  console.log(`FAIL ${current}: ${e.message.split('\n').slice(0, 12).join('\n')}`);
  if (problems.length) console.log('page problems:\n  ' + problems.join('\n  '));
  try {
    await page.screenshot({ path: path.join(SHOTS, 'failure.png'), fullPage: true });
    console.log(`screenshot: ${path.join(SHOTS, 'failure.png')} (at ${page.url()})`);
  } catch (_) { /* the browser is gone */ }
  await context.close().catch(() => {});
  fs.rmSync(profile, { recursive: true, force: true });
  process.exit(1);
}
