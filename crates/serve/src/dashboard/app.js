// The stepwell dashboard: plain JavaScript, no dependencies, no build step.
// Every piece of data goes into the page through text nodes (never innerHTML).
'use strict';
(() => {
  const TOKEN_KEY = 'stepwell.token';
  const TERMINAL = new Set(['completed', 'failed', 'cancelled']);
  const RUN_STATUSES = ['all', 'running', 'waiting', 'completed', 'failed', 'cancelled'];
  const app = document.getElementById('app');
  const enc = encodeURIComponent;

  // ---------- DOM helpers ----------
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'testid') el.dataset.testid = v;
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'value') el.value = v;
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    return add(el, kids);
  }
  function add(el, ...kids) {
    for (const k of kids.flat(Infinity)) {
      if (k == null || k === false) continue;
      el.append(k instanceof Node ? k : String(k));
    }
    return el;
  }
  // Replaces a container's children, keeping the open/closed state of <details data-key>.
  function swap(container, ...kids) {
    const state = new Map();
    for (const d of container.querySelectorAll('details[data-key]')) state.set(d.dataset.key, d.open);
    container.replaceChildren();
    add(container, kids);
    for (const d of container.querySelectorAll('details[data-key]')) {
      if (state.has(d.dataset.key)) d.open = state.get(d.dataset.key);
    }
    return container;
  }
  const pretty = (v) => JSON.stringify(v, null, 2);
  const jsonBlock = (v, testid) => h('pre', { class: 'json', testid }, pretty(v));
  function fold(key, label, body, open) {
    return h('details', { class: 'fold', 'data-key': key, open: !!open }, h('summary', null, label), body);
  }
  const mono = (s, cls) => h('span', { class: 'mono ' + (cls || ''), title: s }, s);
  const idText = (s) => h('span', { class: 'mono id', title: s }, s);
  const muted = (...kids) => h('span', { class: 'muted' }, ...kids);
  const link = (href, ...kids) => h('a', { href }, ...kids);
  const runHref = (id) => '#/runs/' + enc(id);
  const autoHref = (id) => '#/automations/' + enc(id);
  function msg(el, text, kind) {
    el.textContent = text || '';
    el.className = 'msg ' + (kind || 'err');
    el.hidden = !text;
  }
  const sleep = (ms, signal) => new Promise((res) => {
    const t = setTimeout(res, ms);
    if (signal) signal.addEventListener('abort', () => { clearTimeout(t); res(); }, { once: true });
  });
  function uuid() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40; b[8] = (b[8] & 0x3f) | 0x80;
    const x = [...b].map((n) => n.toString(16).padStart(2, '0')).join('');
    return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
  }

  // ---------- time ----------
  function parseTs(s) {
    if (!s) return null;
    const d = new Date(String(s).replace(/(\.\d{3})\d+/, '$1'));
    return isNaN(d.getTime()) ? null : d;
  }
  function rel(d) {
    const s = Math.round((d.getTime() - Date.now()) / 1000);
    const a = Math.abs(s);
    if (a < 5) return 'just now';
    let t;
    if (a < 60) t = a + 's';
    else if (a < 3600) t = Math.floor(a / 60) + ' min';
    else if (a < 86400) t = Math.floor(a / 3600) + 'h ' + Math.floor((a % 3600) / 60) + 'm';
    else t = Math.floor(a / 86400) + 'd ' + Math.floor((a % 86400) / 3600) + 'h';
    return s < 0 ? t + ' ago' : 'in ' + t;
  }
  const p2 = (n) => String(n).padStart(2, '0');
  const absTime = (d) => `${d.getFullYear()}-${p2(d.getMonth() + 1)}-${p2(d.getDate())} ` +
    `${p2(d.getHours())}:${p2(d.getMinutes())}:${p2(d.getSeconds())}`;
  // A relative time, with the absolute one beside it (both=true) or in its tooltip.
  function ts(s, both) {
    const d = parseTs(s);
    if (!d) return muted('—');
    const r = h('time', { datetime: s, 'data-ts': s, title: `${absTime(d)} local · ${s}` }, rel(d));
    return both ? h('span', { class: 'ts' }, r, h('span', { class: 'abs' }, absTime(d))) : r;
  }
  setInterval(() => {
    for (const el of document.querySelectorAll('time[data-ts]')) {
      const d = parseTs(el.dataset.ts);
      if (d) el.textContent = rel(d);
    }
    for (const el of document.querySelectorAll('[data-since]')) el.textContent = soFar(el.dataset.since);
  }, 10000);
  function duration(a, b) {
    const x = parseTs(a), y = parseTs(b);
    if (!x || !y) return '';
    const ms = y - x;
    if (ms < 1) return '';
    if (ms < 1000) return ms + ' ms';
    if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
    const m = Math.floor(ms / 60000);
    if (m < 60) return `${m} min ${Math.floor((ms % 60000) / 1000)} s`;
    if (m < 1440) return `${Math.floor(m / 60)} h ${m % 60} min`;
    return `${Math.floor(m / 1440)} d ${Math.floor((m % 1440) / 60)} h`;
  }

  // ---------- status ----------
  function badge(status, testid) {
    const s = status || 'unknown';
    return h('span', { class: 'badge s-' + s.replace(/[^a-z_]/g, ''), testid }, s);
  }
  const isApproval = (w) => !!(w && w.details && w.details.mode === 'approval_required');
  const tag = (text, cls) => h('span', { class: 'tag ' + (cls || '') }, text);
  // One line saying what a run waits on (or why it ended badly).
  function waitSummary(r) {
    const w = r.waiting;
    if (r.status === 'waiting' && w) {
      if (isApproval(w)) {
        const names = (w.details.tool_calls || []).map((c) => c.name).join(', ');
        return h('span', { class: 'wait-sum' }, tag('approval', 't-person'), mono(names || 'tool calls'));
      }
      if (w.reason === 'user') return h('span', { class: 'wait-sum' }, tag('person', 't-person'), w.prompt || w.wait_key);
      if (w.reason === 'until') return h('span', { class: 'wait-sum' }, tag('timer'), 'until ', ts(w.until));
      if (w.reason === 'subworkflow') {
        const child = w.details && w.details.sub_run_id;
        return h('span', { class: 'wait-sum' }, tag('child run'), child ? link(runHref(child), mono(child, 'short')) : w.wait_key);
      }
      if (controllerOf(r) && /:wake$/.test(w.wait_key || '')) {
        return h('span', { class: 'wait-sum' }, tag('timer'), w.until ? ['next wake ', ts(w.until)] : muted('idle: waits for a command'));
      }
      return h('span', { class: 'wait-sum' }, tag(w.reason || 'wait'), mono(w.wait_key || '', 'short'));
    }
    if ((r.status === 'failed' || r.status === 'cancelled') && r.error) {
      return h('span', { class: 'err-sum', title: r.error }, firstLine(r.error, 90));
    }
    return muted('—');
  }
  function firstLine(s, n) {
    const t = String(s).split('\n')[0];
    return t.length > n ? t.slice(0, n - 1) + '…' : t;
  }
  const controllerOf = (r) => /automation-controller/.test(r.workflow_id || '');

  // ---------- API ----------
  class ApiError extends Error {
    constructor(status, body, text) {
      const e = body && body.error;
      const code = e && (e.code || e.reason_code || 'error');
      const text_ = e && (String(e.message || '').startsWith(code + ':') ? e.message : `${code}: ${e.message || ''}`);
      super(e ? `${text_}${e.field ? ` (field ${e.field})` : ''}`
        : status ? `HTTP ${status}${text ? ': ' + text.slice(0, 200) : ''}` : text);
      this.status = status;
      this.code = e && (e.code || e.reason_code);
    }
  }
  const token = () => sessionStorage.getItem(TOKEN_KEY) || '';
  const authHeaders = (extra) => Object.assign({ Authorization: 'Bearer ' + token() }, extra);
  async function api(method, path, body, accept) {
    const opts = { method, headers: authHeaders(), cache: 'no-store' };
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    let res;
    try { res = await fetch(path, opts); } catch (e) { throw new ApiError(0, null, 'cannot reach the server: ' + e.message); }
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { /* not JSON */ }
    if (res.status === 401) {
      signOut('The server refused the token (401 unauthorized). Enter it again.');
      throw new ApiError(401, data, text);
    }
    if (!res.ok && !(accept && accept.includes(res.status))) throw new ApiError(res.status, data, text);
    return data;
  }
  const items = (x) => (Array.isArray(x) ? x : (x && x.items) || []);

  // Server-Sent Events over fetch (EventSource cannot send the Authorization header).
  // onEvent returning false closes the stream.
  async function sseOnce(path, signal, onOpen, onEvent) {
    const res = await fetch(path, { headers: authHeaders({ Accept: 'text/event-stream' }), signal, cache: 'no-store' });
    if (res.status === 401) {
      signOut('The server refused the token (401 unauthorized). Enter it again.');
      throw new ApiError(401, null, '');
    }
    if (!res.ok || !res.body) throw new ApiError(res.status, null, await res.text().catch(() => ''));
    onOpen();
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    let ev = { event: '', data: [], id: null };
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buf += value;
        let nl;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, nl).replace(/\r$/, '');
          buf = buf.slice(nl + 1);
          if (line === '') {
            if (ev.data.length || ev.event) {
              const out = { event: ev.event || 'message', data: ev.data.join('\n'), id: ev.id };
              ev = { event: '', data: [], id: null };
              if (onEvent(out) === false) return;
            }
            continue;
          }
          if (line[0] === ':') continue;
          const c = line.indexOf(':');
          const field = c < 0 ? line : line.slice(0, c);
          const val = c < 0 ? '' : line.slice(c + 1).replace(/^ /, '');
          if (field === 'event') ev.event = val;
          else if (field === 'data') ev.data.push(val);
          else if (field === 'id') ev.id = val;
        }
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }
  // Follows a stream, reconnecting (with the path pathFn gives then) after a drop.
  async function follow(pathFn, signal, hooks) {
    let delay = 500;
    while (!signal.aborted && token()) {
      try {
        await sseOnce(pathFn(), signal, () => { delay = 500; hooks.onOpen && hooks.onOpen(); }, hooks.onEvent);
        if (hooks.done && hooks.done()) return;
      } catch (e) {
        if (signal.aborted || e.status === 401) return;
        if (e.status === 404) { hooks.onGone && hooks.onGone(e); return; }
      }
      if (signal.aborted) return;
      hooks.onDrop && hooks.onDrop();
      await sleep(delay, signal);
      delay = Math.min(delay * 2, 8000);
    }
  }
  function parse(data) {
    try { return JSON.parse(data); } catch (_) { return null; }
  }

  // ---------- session, live indicator, routing ----------
  const liveEl = document.getElementById('live');
  function setLive(state) {
    liveEl.className = 'live is-' + state;
    liveEl.dataset.state = state;
    liveEl.textContent = { live: 'live', reconnecting: 'reconnecting…', connecting: 'connecting…', off: 'offline' }[state];
  }
  let storeCtl = null;
  // The store stream's position, kept for this tab so a reload does not replay the feed.
  let storeCursor = sessionStorage.getItem('stepwell.feed') || null;
  let view = null;
  let throttle = null;
  function storeEvent(ev) {
    if (ev.id) { storeCursor = ev.id; sessionStorage.setItem('stepwell.feed', ev.id); }
    const wanted = ev.event === 'run' || (ev.event === 'record' && view && view.wantsRecords);
    if (wanted && !throttle) {
      throttle = setTimeout(() => {
        throttle = null;
        if (view && view.refresh) view.refresh();
        refreshWaitsCount();
      }, 500);
    }
  }
  function startStore() {
    storeCtl = new AbortController();
    setLive('connecting');
    const path = () => '/v1/stream' + (storeCursor ? '?after=' + enc(storeCursor) : '');
    follow(path, storeCtl.signal, {
      onOpen: () => setLive('live'),
      onDrop: () => setLive('reconnecting'),
      onEvent: storeEvent,
    });
  }
  const waitsCount = document.getElementById('waits-count');
  async function refreshWaitsCount() {
    try {
      const n = items(await api('GET', '/v1/waits')).length;
      waitsCount.textContent = String(n);
      waitsCount.hidden = n === 0;
    } catch (_) { /* shown elsewhere */ }
  }

  function showLogin(message) {
    if (view && view.cleanup) view.cleanup();
    view = null;
    if (storeCtl) storeCtl.abort();
    storeCtl = null;
    storeCursor = null;
    sessionStorage.removeItem('stepwell.feed');
    setLive('off');
    app.replaceChildren();
    app.hidden = true;
    document.getElementById('nav').hidden = true;
    document.getElementById('signout').hidden = true;
    document.getElementById('login').hidden = false;
    msg(document.getElementById('token-error'), message || '');
    document.getElementById('token-input').focus();
  }
  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin(message);
  }
  function enter() {
    document.getElementById('login').hidden = true;
    document.getElementById('nav').hidden = false;
    document.getElementById('signout').hidden = false;
    app.hidden = false;
    startStore();
    route();
  }
  document.getElementById('token-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const input = document.getElementById('token-input');
    const t = input.value.trim();
    if (!t) return;
    sessionStorage.setItem(TOKEN_KEY, t);
    try {
      await api('GET', '/v1/runs?limit=1');
    } catch (err) {
      if (err.status !== 401) msg(document.getElementById('token-error'), String(err.message));
      return;
    }
    input.value = '';
    enter();
  });
  document.getElementById('signout').addEventListener('click', () => signOut('Signed out.'));

  function route() {
    if (!token()) return showLogin();
    if (view && view.cleanup) view.cleanup();
    view = null;
    const [path, search] = (location.hash || '#/runs').replace(/^#\/?/, '').split('?');
    const [page, id] = path.split('/').map((p) => decodeURIComponent(p || ''));
    const params = new URLSearchParams(search || '');
    for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', a.dataset.nav === (page || 'runs'));
    app.replaceChildren();
    window.scrollTo(0, 0);
    refreshWaitsCount();
    if (page === 'runs' && id) view = runView(id);
    else if (page === 'automations' && id) view = automationView(id);
    else if (page === 'automations') view = automationsView();
    else if (page === 'waits') view = waitsView();
    else if (page === 'workflows') view = workflowsView(id);
    else view = runsView(params);
  }
  window.addEventListener('hashchange', route);

  function pageHead(title, sub, ...right) {
    return h('div', { class: 'page-head' }, h('div', null, h('h1', null, title), sub ? h('p', { class: 'muted' }, sub) : null),
      h('div', { class: 'head-right' }, right));
  }
  const errorBox = (e) => h('div', { class: 'msg err', testid: 'error' }, String(e.message || e));
  const empty = (title, ...hint) => h('div', { class: 'empty', testid: 'empty' }, h('strong', null, title), h('p', null, hint));

  // ---------- Runs ----------
  // The runs page's filters live in the address (#/runs?status=…&workflow=…),
  // so a filtered list can be bookmarked, shared and reloaded.
  const SINCE = [['', 'any time'], ['1h', 'last hour'], ['24h', 'last 24 hours'], ['7d', 'last 7 days'], ['custom', 'between…']];
  const SPAN_MS = { h: 3600e3, d: 86400e3 };
  function sinceTime(preset) {
    const m = /^(\d+)([hd])$/.exec(preset || '');
    return m ? new Date(Date.now() - Number(m[1]) * SPAN_MS[m[2]]).toISOString() : null;
  }
  // A datetime-local value (local time) as an RFC 3339 UTC time.
  const localToUtc = (v) => { const d = v ? new Date(v) : null; return d && !isNaN(d) ? d.toISOString() : null; };
  function runsView(params) {
    const ctl = new AbortController();
    const f = {
      status: params.get('status') || 'all', workflow: params.get('workflow') || '', since: params.get('since') || '',
      from: params.get('from') || '', to: params.get('to') || '', parent: params.get('parent') || '',
    };
    let list = [];
    let next = null;
    let pages = 0;
    const table = h('div', { class: 'table-wrap' });
    const more = h('button', { class: 'btn', testid: 'runs-more', hidden: true, onclick: () => load(true) }, 'Load more');
    const chips = h('div', { class: 'filters', role: 'group', 'aria-label': 'status' }, RUN_STATUSES.map((s) =>
      h('button', {
        class: 'chip' + (s === f.status ? ' active' : ''), testid: 'filter-' + s, 'data-status': s,
        onclick: () => { f.status = s; apply(); },
      }, s)));
    const workflows = h('datalist', { id: 'workflow-ids' });
    const wfInput = h('input', {
      testid: 'filter-workflow', list: 'workflow-ids', placeholder: 'any workflow', spellcheck: 'false', value: f.workflow,
      'aria-label': 'workflow', onchange: (e) => { f.workflow = e.target.value.trim(); apply(); },
    });
    const from = h('input', { type: 'datetime-local', testid: 'filter-from', 'aria-label': 'created from', value: f.from, onchange: (e) => { f.from = e.target.value; apply(); } });
    const to = h('input', { type: 'datetime-local', testid: 'filter-to', 'aria-label': 'created until', value: f.to, onchange: (e) => { f.to = e.target.value; apply(); } });
    const range = h('span', { class: 'row range', hidden: f.since !== 'custom' }, from, muted('to'), to);
    const since = h('select', {
      testid: 'filter-since', 'aria-label': 'created', onchange: (e) => { f.since = e.target.value; range.hidden = f.since !== 'custom'; apply(); },
    }, SINCE.map(([v, label]) => h('option', { value: v }, label)));
    if (f.since && !SINCE.some(([v]) => v === f.since)) since.append(h('option', { value: f.since }, 'last ' + f.since));
    since.value = f.since;
    const idMsg = h('span', { class: 'err-sum', testid: 'find-error', hidden: true });
    const idInput = h('input', { testid: 'find-run', placeholder: 'run id', spellcheck: 'false', 'aria-label': 'run id' });
    const find = h('form', {
      class: 'row find', onsubmit: async (e) => {
        e.preventDefault();
        const id = idInput.value.trim();
        if (!id) return;
        try {
          await api('GET', '/v1/runs/' + enc(id), undefined, [404]).then((r) => { if (!r || r.error) throw new Error(`No run with id ${id}.`); });
          location.hash = runHref(id);
        } catch (err) { idMsg.textContent = err.message; idMsg.hidden = false; }
      },
    }, idInput, h('button', { class: 'btn small', type: 'submit', testid: 'find-submit' }, 'Open'), idMsg);
    const parentChip = h('span');
    const clear = h('a', { href: '#/runs', testid: 'filter-clear', class: 'small' }, 'clear filters');
    add(app, h('div', { testid: 'runs-page' },
      pageHead('Runs', 'Every run in the store, newest first.'),
      startForm(),
      h('div', { class: 'card filter-bar', testid: 'run-filters' }, chips,
        h('div', { class: 'row' }, h('label', { class: 'field' }, muted('Workflow'), wfInput, workflows),
          h('label', { class: 'field' }, muted('Created'), since), range, parentChip, clear),
        find),
      table, h('div', { class: 'more' }, more)));

    function apply() {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(f)) if (v && !(k === 'status' && v === 'all') && !((k === 'from' || k === 'to') && f.since !== 'custom')) q.set(k, v);
      history.replaceState(null, '', '#/runs' + (q.toString() ? '?' + q : ''));
      for (const b of chips.children) b.classList.toggle('active', b.dataset.status === f.status);
      swap(parentChip, f.parent ? h('span', { class: 'chip active', testid: 'filter-parent' }, 'children of ', mono(f.parent, 'short'), ' ',
        h('button', { class: 'x', 'aria-label': 'remove', onclick: () => { f.parent = ''; apply(); } }, '×')) : null);
      clear.hidden = !(f.workflow || f.since || f.parent || f.status !== 'all');
      load(false);
    }
    // The filters as one request's query, read once: a fetch that was
    // overtaken by a change of the filters never mixes old and new.
    function query() {
      // Summaries: a page stays small whatever the runs' vars hold.
      const q = new URLSearchParams({ limit: '50', view: 'summary' });
      if (f.status !== 'all') q.set('status', f.status);
      if (f.workflow) q.set('workflow_id', f.workflow);
      if (f.parent) q.set('parent_run_id', f.parent);
      const s = f.since === 'custom' ? localToUtc(f.from) : sinceTime(f.since);
      const u = f.since === 'custom' ? localToUtc(f.to) : null;
      if (s) q.set('since', s);
      if (u) q.set('until', u);
      return q;
    }
    // A time window may answer short pages (the server reads a bounded
    // number of runs per request): read on until the page is full.
    async function fetchPage(cursor) {
      const base = query();
      let got = [];
      let page;
      for (let i = 0; i < 5; i++) {
        const q = new URLSearchParams(base);
        if (cursor) q.set('cursor', cursor);
        page = await api('GET', '/v1/runs?' + q);
        got = got.concat(items(page));
        cursor = page.next_cursor;
        if (!cursor || got.length >= 50) break;
      }
      return { items: got, next_cursor: cursor || null };
    }
    // Each load or refresh takes a number; an answer that is not the
    // latest one's is dropped.
    let latest = 0;
    async function load(append) {
      const mine = ++latest;
      try {
        const page = await fetchPage(append ? next : null);
        if (ctl.signal.aborted || mine !== latest) return;
        list = append ? list.concat(page.items) : page.items;
        pages = append ? pages + 1 : 1;
        next = page.next_cursor;
        render();
      } catch (e) {
        if (!ctl.signal.aborted && mine === latest) swap(table, errorBox(e));
      }
    }
    async function refresh() {
      if (pages > 1) {
        // Keep what "load more" brought in; refresh the first page.
        const mine = ++latest;
        try {
          const page = await fetchPage(null);
          if (ctl.signal.aborted || mine !== latest) return;
          const ids = new Set(page.items.map((r) => r.run_id));
          list = page.items.concat(list.filter((r) => !ids.has(r.run_id)));
          render();
        } catch (_) { /* keep the last view */ }
      } else load(false);
    }
    function render() {
      more.hidden = !next;
      const seen = new Set(list.map((r) => r.workflow_id));
      for (const o of workflows.children) seen.add(o.value);
      swap(workflows, [...seen].sort().map((w) => h('option', { value: w })));
      table.dataset.count = String(list.length);
      if (!list.length) {
        const filtered = f.status !== 'all' || f.workflow || f.since || f.parent;
        swap(table, !filtered
          ? empty('No runs yet.', 'Start one with the form above, or from a shell: ', h('code', null, 'stepwell run flows/examples/hello'), '.')
          : empty('No run matches these filters.', 'Change them, or ', h('a', { href: '#/runs', testid: 'empty-clear' }, 'show all runs'), '.'));
        return;
      }
      swap(table, h('table', { class: 'grid', testid: 'runs-table' },
        h('thead', null, h('tr', null, [['Run'], ['Workflow'], ['Status'], ['Waiting on / error', 'hide-sm'], ['Took', 'num'], ['Updated'], ['Created', 'hide-sm']]
          .map(([t, c]) => h('th', { class: c }, t)))),
        h('tbody', null, list.map(runRow))));
    }
    api('GET', '/v1/workflows').then((w) => {
      if (ctl.signal.aborted) return;
      const seen = new Set([...workflows.children].map((o) => o.value).concat(items(w).map((x) => x.workflow_id)));
      swap(workflows, [...seen].sort().map((x) => h('option', { value: x })));
    }).catch(() => {});
    apply();
    return { cleanup: () => ctl.abort(), refresh };
  }
  // How long a run took (ended) or has taken so far (kept current).
  function runTook(r) {
    if (TERMINAL.has(r.status)) return duration(r.created_at, r.updated_at) || 'under 1 ms';
    return h('span', { 'data-since': r.created_at }, soFar(r.created_at));
  }
  const soFar = (t) => (duration(t, new Date().toISOString()) || 'under 1 ms') + ' so far';
  function runRow(r) {
    return h('tr', {
      class: 'clickable', testid: 'run-row', 'data-run-id': r.run_id, 'data-status': r.status, 'data-workflow': r.workflow_id,
      onclick: (e) => { if (!e.target.closest('a')) location.hash = runHref(r.run_id); },
    },
    h('td', null, link(runHref(r.run_id), idText(r.run_id)),
      controllerOf(r) ? [' ', h('a', { class: 'tag t-auto', href: autoHref(r.run_id) }, 'automation')] : null,
      r.parent_run_id ? [' ', h('a', { class: 'tag', href: runHref(r.parent_run_id), title: 'child of ' + r.parent_run_id }, 'child')] : null),
    h('td', null, mono(r.workflow_id, 'wf')),
    h('td', null, badge(r.status)),
    h('td', { class: 'wait-cell hide-sm' }, waitSummary(r)),
    h('td', { class: 'num', testid: 'run-took' }, runTook(r)),
    h('td', null, ts(r.updated_at, true)),
    h('td', { class: 'hide-sm' }, ts(r.created_at)));
  }
  function startForm() {
    const saved = JSON.parse(localStorage.getItem('stepwell.start') || '{}');
    const kind = h('select', { testid: 'start-kind', 'aria-label': 'what to start' },
      h('option', { value: 'bundle' }, 'Bundle directory'), h('option', { value: 'workflow_id' }, 'Workflow id'));
    kind.value = saved.kind || 'bundle';
    const target = h('input', { testid: 'start-bundle', spellcheck: 'false', value: saved.target || '' });
    const hint = () => { target.placeholder = kind.value === 'bundle' ? 'a bundle directory on the server, e.g. /srv/flows/examples/ask-user' : 'a workflow the store knows, e.g. ask-user'; };
    kind.addEventListener('change', hint);
    hint();
    const vars = h('textarea', { testid: 'start-vars', rows: 3, spellcheck: 'false', placeholder: '{"name": "Ada"}' }, '{}');
    const runId = h('input', { testid: 'start-run-id', spellcheck: 'false', placeholder: 'run id (optional: a UUID is made)' });
    const error = h('p', { class: 'msg err', testid: 'start-error', hidden: true });
    const submit = h('button', { class: 'btn primary', type: 'submit', testid: 'start-submit' }, 'Start run');
    const form = h('form', {
      class: 'start-form', onsubmit: async (e) => {
        e.preventDefault();
        let v;
        try { v = vars.value.trim() ? JSON.parse(vars.value) : {}; } catch (err) { return msg(error, 'Vars are not valid JSON: ' + err.message); }
        if (!v || typeof v !== 'object' || Array.isArray(v)) return msg(error, 'Vars must be a JSON object, like {"name": "Ada"}.');
        const t = target.value.trim();
        if (!t) return msg(error, kind.value === 'bundle' ? 'Enter a bundle directory on the server.' : 'Enter a workflow id.');
        const body = { [kind.value === 'bundle' ? 'bundle' : 'workflow_id']: t, vars: v };
        if (runId.value.trim()) body.run_id = runId.value.trim();
        localStorage.setItem('stepwell.start', JSON.stringify({ kind: kind.value, target: t }));
        msg(error, '');
        submit.disabled = true;
        submit.textContent = 'Starting…';
        try {
          const st = await api('POST', '/v1/runs', body);
          location.hash = runHref(st.run_id);
        } catch (err) {
          msg(error, String(err.message));
        } finally {
          submit.disabled = false;
          submit.textContent = 'Start run';
        }
      },
    },
    h('div', { class: 'row' }, kind, target),
    h('label', null, 'Vars (JSON object)'), vars,
    h('div', { class: 'row' }, runId, submit), error);
    const d = fold('start', 'Start a run', form, localStorage.getItem('stepwell.startOpen') !== '0');
    d.classList.add('card', 'start');
    d.dataset.testid = 'start-form';
    d.addEventListener('toggle', () => localStorage.setItem('stepwell.startOpen', d.open ? '1' : '0'));
    return d;
  }

  // Where a fork came from: `vars._meta.forked_from`, if it is one.
  function forkedFrom(r) {
    return r.vars && r.vars._meta && r.vars._meta.forked_from ? r.vars._meta.forked_from : null;
  }

  // ---------- The flow picture ----------
  const SVG = 'http://www.w3.org/2000/svg';
  function s(tag, attrs, ...kids) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v != null) el.setAttribute(k, String(v));
    for (const k of kids) if (k != null) el.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return el;
  }
  // The most nodes drawn; a larger flow is listed instead.
  const MAX_DRAWN = 120;
  // What the ledger says of the path a run took: the nodes it visited and
  // the moves between them (a component may go to a node no edge names).
  function pathOf(records) {
    const visited = new Set();
    const moves = new Set();
    let last = null;
    for (const r of records) {
      if (!r.node_id) continue;
      visited.add(r.node_id);
      if (last && last !== r.node_id) moves.add(last + '\u0000' + r.node_id);
      last = r.node_id;
    }
    return { visited, moves };
  }
  // Layers by breadth-first distance from the entry; nodes the entry does
  // not reach go last.
  function layers(flow, moves) {
    const out = new Map();
    for (const n of flow.nodes) out.set(n.id, []);
    const edge = (a, b, label, kind) => { if (out.has(a) && out.has(b)) out.get(a).push({ from: a, to: b, label, kind }); };
    for (const n of flow.nodes) {
      if (n.next) edge(n.id, n.next, null, 'next');
      for (const [label, to] of Object.entries(n.routes || {})) edge(n.id, to, label, 'route');
    }
    for (const m of moves) {
      const [a, b] = m.split('\u0000');
      if (out.has(a) && !out.get(a).some((e) => e.to === b)) edge(a, b, null, 'dynamic');
    }
    const start = out.has(flow.entry) ? [flow.entry] : [];
    const depth = new Map(start.map((id) => [id, 0]));
    const queue = [...start];
    while (queue.length) {
      const id = queue.shift();
      for (const e of out.get(id) || []) if (!depth.has(e.to)) { depth.set(e.to, depth.get(id) + 1); queue.push(e.to); }
    }
    const deepest = depth.size ? Math.max(...depth.values()) : -1;
    const rows = [];
    for (const n of flow.nodes) if (!depth.has(n.id)) depth.set(n.id, deepest + 1);
    const order = [...depth.keys()];
    for (const id of order) (rows[depth.get(id)] = rows[depth.get(id)] || []).push(id);
    return { rows: rows.filter(Boolean), edges: [...out.values()].flat() };
  }
  function nodeState(id, run, path) {
    if (run.current_node === id && !TERMINAL.has(run.status)) return 'current';
    if (run.current_node === id && run.status === 'failed') return 'failed';
    if (run.current_node === id && run.status === 'cancelled') return 'stopped';
    return path.visited.has(id) ? 'visited' : 'idle';
  }
  const clip = (t, n) => (t.length > n ? t.slice(0, n - 1) + '…' : t);
  function flowPicture(flow, run, records) {
    const path = pathOf(records);
    if (!flow.nodes.length) return muted('The flow has no nodes.');
    if (flow.nodes.length > MAX_DRAWN) {
      return h('p', { class: 'muted', testid: 'flow-too-large' }, `${flow.nodes.length} nodes: too many to draw. `,
        run.current_node ? ['The run is at ', mono(run.current_node), '.'] : null);
    }
    // PAD leaves room above the first row for a self-loop.
    const W = 170, H = 44, GX = 26, GY = 46, PAD = 28;
    const { rows, edges } = layers(flow, path.moves);
    const widest = Math.max(...rows.map((r) => r.length));
    const backs = edges.filter((e) => e.from !== e.to && rows.findIndex((r) => r.includes(e.to)) <= rows.findIndex((r) => r.includes(e.from)));
    // Room on the right for the arrows that go back up.
    const width = PAD * 2 + widest * W + (widest - 1) * GX + (edges.some((e) => e.from === e.to) || backs.length ? 40 + 14 * backs.length : 0);
    const at = new Map();
    rows.forEach((row, y) => {
      const left = (width - (row.length * W + (row.length - 1) * GX)) / 2;
      row.forEach((id, x) => at.set(id, { x: left + x * (W + GX), y: PAD + y * (H + GY) }));
    });
    const height = PAD * 2 + rows.length * H + (rows.length - 1) * GY;
    const svg = s('svg', { viewBox: `0 0 ${width} ${height}`, width, height, class: 'flow', 'data-testid': 'flow', role: 'img',
      'aria-label': `the flow ${flow.workflow_id}: ${flow.nodes.length} nodes` });
    svg.append(s('defs', null, s('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
      s('path', { d: 'M0,0 L10,5 L0,10 z', class: 'arrow' }))));
    for (const e of edges) {
      const a = at.get(e.from), b = at.get(e.to);
      const taken = path.moves.has(e.from + '\u0000' + e.to);
      const x1 = a.x + W / 2, y1 = a.y + H, x2 = b.x + W / 2, y2 = b.y;
      const back = b.y <= a.y;
      const out = 30 + 14 * Math.max(0, backs.indexOf(e));
      // A self-loop rides on the node's top edge, in the gap above it,
      // where no other node is.
      const d = e.from === e.to
        ? `M${a.x + W - 44},${a.y} C${a.x + W - 44},${a.y - 24} ${a.x + W - 12},${a.y - 24} ${a.x + W - 12},${a.y - 1}`
        : b.y === a.y
          ? (b.x > a.x ? `M${a.x + W},${a.y + H / 2 + 6} L${b.x + 1},${b.y + H / 2 + 6}` : `M${a.x},${a.y + H / 2 - 6} L${b.x + W - 1},${b.y + H / 2 - 6}`)
          : back
          ? `M${a.x + W},${a.y + H / 2} C${a.x + W + out},${a.y + H / 2} ${b.x + W + out},${b.y + H / 2} ${b.x + W},${b.y + H / 2}`
          : `M${x1},${y1} C${x1},${y1 + GY / 2} ${x2},${y2 - GY / 2} ${x2},${y2 - 1}`;
      svg.append(s('path', { d, class: `edge e-${e.kind}${taken ? ' taken' : ''}`, 'marker-end': 'url(#arrow)', 'data-testid': 'flow-edge',
        'data-from': e.from, 'data-to': e.to, 'data-taken': taken ? 'yes' : 'no' }));
      if (e.label) {
        const [lx, ly] = e.from === e.to ? [a.x + W - 8, a.y - 12] : b.y === a.y ? [(a.x + b.x + W) / 2 - 10, a.y - 3] : back ? [a.x + W + 6, a.y + H / 2 - 5] : [(x1 + x2) / 2 + 4, (y1 + y2) / 2];
        svg.append(s('text', { x: lx, y: ly, class: 'edge-label' }, clip(e.label, 16)));
      }
    }
    const byId = new Map(flow.nodes.map((n) => [n.id, n]));
    for (const [id, p] of at) {
      const n = byId.get(id);
      const state = nodeState(id, run, path);
      const what = n.kind === 'effect' ? n.effect : n.kind;
      svg.append(s('g', { class: `fnode k-${n.kind} n-${state}`, 'data-testid': 'flow-node', 'data-node': id, 'data-state': state, transform: `translate(${p.x},${p.y})` },
        s('title', null, `${id} (${what})${id === flow.entry ? ', the entry' : ''}: ${state}`),
        s('rect', { width: W, height: H, rx: n.kind === 'complete' ? H / 2 : 7 }),
        s('text', { x: W / 2, y: 19, class: 'n-id' }, clip(id, 21)),
        s('text', { x: W / 2, y: 34, class: 'n-kind' }, clip(what || '', 24))));
    }
    return h('div', { class: 'flow-wrap' }, svg);
  }
  const legend = () => h('p', { class: 'legend small muted' },
    [['n-current', 'current'], ['n-visited', 'visited'], ['n-failed', 'failed here'], ['n-idle', 'not reached']]
      .map(([c, t]) => h('span', { class: 'item' }, h('span', { class: 'key ' + c }), t)),
    h('span', { class: 'item' }, 'a solid arrow: a move the run made'));

  // ---------- Child runs ----------
  // The first value under `key` in a JSON value, a few levels deep.
  function findKey(v, key, depth) {
    if (!v || typeof v !== 'object' || depth > 4) return null;
    if (typeof v[key] === 'string') return v[key];
    for (const x of Object.values(v)) { const f = findKey(x, key, depth + 1); if (f) return f; }
    return null;
  }
  const childOf = (rec) => findKey(rec.result, 'sub_run_id', 0) ||
    (rec.effect && /start_occurrence|start_subworkflow/.test(rec.effect.type || '') ? findKey(rec.effect.payload, 'run_id', 3) : null);
  function childRuns(list, parentId, more) {
    return h('section', { class: 'card', testid: 'child-runs' },
      h('div', { class: 'section-head' }, h('h2', null, 'Child runs ', h('span', { class: 'count plain' }, String(list.length) + (more ? '+' : ''))),
        more ? link('#/runs?parent=' + enc(parentId), 'all of them →') : null),
      h('div', { class: 'table-wrap' }, h('table', { class: 'grid' },
        h('thead', null, h('tr', null, ['Run', 'Workflow', 'Status', 'Took', 'Created'].map((t) => h('th', null, t)))),
        h('tbody', null, list.map((r) => h('tr', { testid: 'child-row', 'data-run-id': r.run_id },
          h('td', null, link(runHref(r.run_id), idText(r.run_id))), h('td', null, mono(r.workflow_id, 'wf')),
          h('td', null, badge(r.status)), h('td', { class: 'num' }, runTook(r)), h('td', null, ts(r.created_at))))))));
  }

  // ---------- An automation's controller, readable ----------
  const EVENT_TEXT = {
    created: (p) => `Created: ${(p.definition && p.definition.title) || 'untitled'}, revision ${p.revision}`,
    admitted: (p) => `Occurrence #${p.index} admitted: its trigger fired${p.attempt > 1 ? ` (attempt ${p.attempt})` : ''}`,
    dispatched: (p) => `Occurrence #${p.index} started${p.attempt > 1 ? ` (attempt ${p.attempt})` : ''}`,
    completed: (p) => `Occurrence #${p.index} ended: ${p.status || 'completed'}${p.attempts > 1 ? ` after ${plural(p.attempts, 'attempt')}` : ''}`,
    retry_scheduled: (p) => `Occurrence #${p.index} failed: retry scheduled${p.retry_at ? ' for ' + absTime(parseTs(p.retry_at) || new Date(0)) : ''}`,
    coalesced: () => 'Missed fire times coalesced into one',
    passed_over: () => 'A missed fire time passed over',
    paused: () => 'Paused', resumed: () => 'Resumed', revised: (p) => `Revised to revision ${p.revision}`,
    archived: () => 'Archived', unarchived: () => 'Unarchived',
    command_result: (p) => `Command ${String(p.type || '?').replace(/^automation\./, '').replace(/_/g, ' ')}` +
      `${p.actor ? ' from ' + p.actor : ''}: ${p.status || '?'}${p.error ? ' (' + (p.error.reason_code || p.error.code || 'error') + ')' : ''}`,
  };
  const plural = (n, word, many) => `${n} ${n === 1 ? word : many || word + 's'}`;
  // One line for a controller record that says what the automation did;
  // null for the records that are its bookkeeping.
  function activityOf(rec) {
    const e = rec.effect;
    if (e && e.type === 'emit_event' && e.payload && /^automation\./.test(e.payload.name || '')) {
      const kind = e.payload.name.slice('automation.'.length);
      const p = e.payload.payload || {};
      const text = EVENT_TEXT[kind] ? EVENT_TEXT[kind](p) : kind.replace(/_/g, ' ');
      return { kind, text, at: p.at || rec.ended_at, run: p.run_id || null, status: p.status || null };
    }
    const w = rec.status === 'waiting' && rec.result && rec.result.wait;
    if (w && w.until && /:wake$/.test(w.wait_key || '')) return { kind: 'sleep', text: 'Sleeps until the next fire', at: rec.ended_at, until: w.until };
    return null;
  }
  function activityItem(a, seq) {
    return h('li', { class: 'act-item', testid: 'activity-item', 'data-kind': a.kind, 'data-seq': seq },
      tag(a.kind.replace(/_/g, ' '), a.kind === 'completed' && a.status && a.status !== 'completed' ? 't-fail' : 't-note'),
      h('span', null, a.text), a.until ? [' ', ts(a.until, true)] : null,
      a.run ? [' ', h('a', { href: runHref(a.run), testid: 'child-link' }, 'run ', mono(a.run, 'short'))] : null,
      h('span', { class: 'tl-time' }, muted('#' + seq + ' · '), ts(a.at)));
  }

  // ---------- One run ----------
  function runView(id) {
    const ctl = new AbortController();
    let run = null;
    let lastSeq = null;
    let ended = false;
    let waitKey = null;
    let flow = null;
    let input;
    let lastEnd = null;
    const records = [];
    const head = h('div', { class: 'card run-head' });
    const wait = h('div');
    const flowBox = h('div', { class: 'flow-box' });
    const results = h('div');
    const children = h('div');
    const activity = h('ol', { class: 'activity plain', testid: 'activity' });
    const actCard = h('section', { class: 'card', testid: 'activity-card', hidden: true },
      h('h2', null, 'What the automation did'),
      h('p', { class: 'muted small' }, 'Its controller\'s decisions, read from the ledger: occurrences, commands, sleeps. Every raw record is in the timeline below.'), activity);
    const timeline = h('ol', { class: 'timeline', testid: 'timeline' });
    const follow_ = h('span', { class: 'live-small', testid: 'timeline-live' }, 'connecting…');
    const rawToggle = h('label', { class: 'toggle', hidden: true }, h('input', {
      type: 'checkbox', testid: 'show-raw', onchange: (e) => { timeline.hidden = !e.target.checked; },
    }), ' show every record');
    add(app, h('div', { testid: 'run-page', 'data-run-id': id },
      h('div', { class: 'crumbs' }, link('#/runs', 'Runs'), ' / ', mono(id)),
      head, wait, h('section', { class: 'card', testid: 'flow-card' }, h('h2', null, 'Flow'), flowBox), results, children, actCard,
      h('section', { class: 'card' }, h('div', { class: 'section-head' }, h('h2', null, 'Timeline'), h('div', { class: 'row' }, rawToggle, follow_)),
        h('p', { class: 'muted small' }, 'The run\'s ledger: one record per step, oldest first; beside each, the time since the record before.'), timeline)));
    let drawSoon = null;
    function drawFlow() {
      if (drawSoon) return;
      drawSoon = setTimeout(() => {
        drawSoon = null;
        if (flow && run) swap(flowBox, flowPicture(flow, run, records), legend());
      }, 100);
    }
    let childrenSoon = null;
    function loadChildren() {
      if (childrenSoon) return;
      childrenSoon = setTimeout(async () => {
        childrenSoon = null;
        try {
          const page = await api('GET', `/v1/runs?parent_run_id=${enc(id)}&view=summary&limit=50`);
          if (ctl.signal.aborted) return;
          const list = items(page);
          swap(children, list.length ? childRuns(list, id, !!page.next_cursor) : null);
        } catch (_) { /* keep */ }
      }, 300);
    }

    function setRun(st) {
      if (!st || (run && st.version != null && run.version != null && st.version < run.version)) return;
      run = st;
      renderHead();
      const key = run.status + '|' + (run.waiting ? run.waiting.wait_key : '') + (run.resuming ? '|resuming' : '');
      if (key !== waitKey) { waitKey = key; swap(wait, waitPanel()); loadChildren(); }
      renderResults();
      drawFlow();
    }
    async function reloadState() {
      try { setRun(await api('GET', '/v1/runs/' + enc(id))); } catch (_) { /* keep */ }
    }
    function renderHead() {
      const r = run;
      const occ = r.vars && r.vars._meta && r.vars._meta.occurrence;
      const meta = [
        ['Workflow', [mono(r.workflow_id), r.workflow_version
          ? [' ', link('#/workflows/' + encodeURIComponent(r.workflow_id), 'version ' + r.workflow_version)] : null]],
        ['Run id', idText(r.run_id)],
        ['Current node', r.current_node ? mono(r.current_node) : muted('—')],
        ['Took', h('span', { testid: 'run-took' }, runTook(r) || muted('—'))],
        ['Created', ts(r.created_at, true)],
        ['Updated', ts(r.updated_at, true)],
        ['State version', String(r.version == null ? '—' : r.version)],
        r.parent_run_id && ['Parent run', link(runHref(r.parent_run_id), idText(r.parent_run_id))],
        occ && occ.automation_id && ['Automation', h('span', null, link(autoHref(occ.automation_id), idText(occ.automation_id)),
          ` occurrence #${occ.occurrence_index}, attempt ${occ.attempt}`)],
        controllerOf(r) && ['Automation', link(autoHref(r.run_id), 'open the automation page')],
        forkedFrom(r) && ['Forked from', h('span', { testid: 'forked-from' }, link(runHref(forkedFrom(r).run), idText(forkedFrom(r).run)),
          forkedFrom(r).seq != null ? ` at record #${forkedFrom(r).seq}` : ' from a snapshot', ` (node ${forkedFrom(r).node})`)],
        r.actor_id && ['Actor', mono(r.actor_id)],
        r.session_id && ['Session', mono(r.session_id)],
      ].filter(Boolean);
      const cancel = !TERMINAL.has(r.status) ? h('button', {
        class: 'btn danger-ghost', testid: 'cancel', onclick: async (e) => {
          if (!confirm(`Cancel run ${r.run_id}? Its child runs are cancelled too. This cannot be undone.`)) return;
          e.target.disabled = true;
          try { setRun(await api('POST', `/v1/runs/${enc(id)}/cancel`, { reason: 'cancelled from the dashboard' })); } catch (err) { alert(err.message); } finally { e.target.disabled = false; }
        },
      }, 'Cancel run') : null;
      swap(head,
        h('div', { class: 'page-head' }, h('div', null, h('h1', null, r.workflow_id, ' ', badge(r.status, 'run-status'))), h('div', { class: 'head-right' }, cancel)),
        h('dl', { class: 'meta' }, meta.map(([k, v]) => [h('dt', null, k), h('dd', null, v)])));
    }
    function renderResults() {
      const r = run;
      swap(results,
        r.status === 'completed' ? h('section', { class: 'card ok-card' }, h('h2', null, 'Output'), jsonBlock(r.output, 'run-output')) : null,
        r.error ? h('section', { class: 'card err-card' }, h('h2', null, r.status === 'cancelled' ? 'Cancelled' : 'Error'),
          h('pre', { class: 'error-text', testid: 'run-error' }, r.error)) : null,
        input !== undefined ? h('section', { class: 'card big-fold' }, fold('input', 'Input: the vars it started with', jsonBlock(input, 'run-input'), true)) : null,
        h('section', { class: 'card big-fold' }, fold('vars', 'Vars now', jsonBlock(r.vars || {}, 'run-vars'))));
    }
    async function resume(payload, panel) {
      const err = panel.querySelector('.wait-msg');
      const buttons = panel.querySelectorAll('button, input');
      buttons.forEach((b) => { b.disabled = true; });
      msg(err, '');
      try {
        setRun(await api('POST', `/v1/runs/${enc(id)}/resume`, { payload, wait_key: run.waiting.wait_key }));
      } catch (e) {
        msg(err, e.status === 409 ? 'The run is no longer waiting on this (someone else answered?). Reloaded. ' + e.message : String(e.message));
        buttons.forEach((b) => { b.disabled = false; });
        if (e.status === 409) { waitKey = null; reloadState(); }
      }
    }
    function waitPanel() {
      const r = run;
      if (r.status !== 'waiting' || !r.waiting) return null;
      const w = r.waiting;
      const errEl = h('p', { class: 'msg err wait-msg', testid: 'wait-error', hidden: true });
      const panel = h('section', { class: 'card wait-card', testid: 'wait-panel', 'data-reason': w.reason });
      const since = h('p', { class: 'muted small' }, 'Waiting since ', ts(r.updated_at), ' · key ', mono(w.wait_key || ''));
      if (isApproval(w) && r.resuming) {
        panel.dataset.kind = 'approval-running';
        add(panel, h('h2', null, 'Approved: the tool calls are running'),
          h('p', { testid: 'resuming' }, 'The run goes on with their results when they end. Cancelling the run stops them.'), since);
      } else if (isApproval(w)) {
        panel.dataset.kind = 'approval';
        const reason = h('input', { testid: 'deny-reason', placeholder: 'Reason (optional, the run sees it)' });
        const denyBox = h('div', { class: 'row deny-box', hidden: true }, reason,
          h('button', { class: 'btn danger', testid: 'deny-confirm', onclick: () => resume(reason.value.trim() ? { approved: false, reason: reason.value.trim() } : { approved: false }, panel) }, 'Deny these calls'));
        add(panel, h('h2', null, 'Tool approval needed'),
          h('p', null, 'The run asks to call these tools. Approving runs them now, inside the run\'s sandbox. Read the arguments first.'), since,
          h('ol', { class: 'tool-calls' }, (w.details.tool_calls || []).map((c) => h('li', { class: 'tool-call', testid: 'tool-call', 'data-tool': c.name },
            h('div', null, h('strong', { class: 'mono' }, c.name), ' ', c.call_id ? muted(mono(c.call_id)) : null),
            jsonBlock(c.arguments == null ? {} : c.arguments)))),
          h('div', { class: 'row' },
            h('button', { class: 'btn approve', testid: 'approve', onclick: () => resume({ approved: true }, panel) }, 'Approve'),
            h('button', { class: 'btn danger-ghost', testid: 'deny', onclick: () => { denyBox.hidden = false; reason.focus(); } }, 'Deny…')),
          denyBox, errEl);
      } else if (w.reason === 'user') {
        panel.dataset.kind = 'ask';
        const choices = Array.isArray(w.choices) && w.choices.length ? w.choices : null;
        const input = h('input', { testid: 'answer-input', placeholder: 'Your answer', autocomplete: 'off' });
        add(panel, h('h2', null, 'Waiting for an answer'),
          h('p', { class: 'prompt', testid: 'wait-prompt' }, w.prompt || '(no prompt)'), since,
          choices ? h('div', { class: 'row' }, choices.map((c) => h('button', { class: 'btn', testid: 'answer-choice', 'data-choice': c, onclick: () => resume({ text: c }, panel) }, c)))
            : h('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); resume({ text: input.value }, panel); } },
              input, h('button', { class: 'btn primary', type: 'submit', testid: 'answer-submit' }, 'Answer')),
          w.details ? fold('wait-details', 'Details', jsonBlock(w.details)) : null, errEl);
      } else if (w.reason === 'until') {
        const retry = w.details && w.details.retry;
        add(panel, h('h2', null, retry ? 'Waiting to retry' : 'Sleeping'),
          h('p', null, 'Until ', ts(w.until, true), '. The server\'s driver moves it on when the time comes.'),
          retry ? h('p', null, `Retrying ${retry.effect} (attempt ${retry.attempt}) after: `, h('span', { class: 'err-sum' }, retry.error)) : null, since);
      } else if (w.reason === 'subworkflow') {
        const d = w.details || {};
        add(panel, h('h2', null, 'Waiting on a child run'),
          h('p', null, d.sub_run_id ? link(runHref(d.sub_run_id), idText(d.sub_run_id)) : mono(w.wait_key), d.sub_workflow_id ? [' (', mono(d.sub_workflow_id), ')'] : null), since);
      } else {
        add(panel, h('h2', null, w.reason === 'event' ? 'Waiting for an event' : 'Waiting on a job'),
          h('p', null, mono(w.wait_key)), w.prompt ? h('p', { class: 'prompt' }, w.prompt) : null,
          w.until ? h('p', null, 'Deadline ', ts(w.until, true)) : null, since,
          w.details ? fold('wait-details', 'Details', jsonBlock(w.details)) : null);
      }
      return panel;
    }
    function addRecord(rec, sseId) {
      const seq = rec.seq != null ? Number(rec.seq) : Number(sseId);
      if (!isNaN(seq)) {
        if (lastSeq != null && seq <= lastSeq) return;
        lastSeq = seq;
      }
      const eff = rec.effect || null;
      const kind = eff && (eff.type || eff.kind);
      const ename = eff && eff.payload && typeof eff.payload.name === 'string' ? eff.payload.name : null;
      const extra = {};
      if (eff) extra.effect = eff;
      if (rec.result !== undefined && rec.result !== null) extra.result = rec.result;
      if (rec.error) extra.error = rec.error;
      // The vars it started with: on its first step's record (a fork's
      // first record says where it came from; its step's follows).
      if (input === undefined && rec.input !== undefined) { input = rec.input; if (run) renderResults(); }
      records.push(rec);
      const end = rec.ended_at || rec.started_at;
      const dur = duration(lastEnd || (run && run.created_at), end);
      lastEnd = end;
      const child = childOf(rec);
      const act = run && controllerOf(run) ? activityOf(rec) : null;
      if (act) activity.append(activityItem(act, seq));
      if (child) loadChildren();
      drawFlow();
      timeline.append(h('li', { class: 'tl-item st-' + rec.status, testid: 'timeline-record', 'data-seq': isNaN(seq) ? null : seq, 'data-status': rec.status },
        h('div', { class: 'tl-head' },
          h('span', { class: 'seq mono' }, isNaN(seq) ? '#' : '#' + seq),
          badge(rec.status), mono(rec.node_id || '—', 'node'),
          kind ? tag(kind + (ename ? ' · ' + ename : ''), 't-effect') : null,
          rec.attempt > 1 ? tag('attempt ' + rec.attempt, 't-warn') : null,
          child ? h('a', { class: 'tag t-run', href: runHref(child), testid: 'child-link' }, 'child run →') : null,
          h('span', { class: 'tl-time' }, ts(rec.ended_at || rec.started_at),
            h('span', { class: 'muted', testid: 'step-took', title: 'time since the record before' }, ' · ' + (dur ? '+' + dur : 'under 1 ms')))),
        rec.error ? h('div', { class: 'err-sum' }, firstLine(rec.error, 200))
          : extra.result !== undefined ? h('div', { class: 'preview mono', title: 'result' }, '→ ', firstLine(JSON.stringify(extra.result), 160)) : null,
        Object.keys(extra).length ? fold('rec-' + seq, 'effect / result / error', jsonBlock(extra)) : null));
    }
    // A "Fork from here" button on each record a fork can start from.
    let forksSoon = null;
    // Whether the run may be forked at all: not a controller's, nor a run
    // an automation owns (an occurrence, a discussion's turn), which the
    // server refuses (409 not_forkable).
    const forkable = (r) => {
      const meta = (r && r.vars && r.vars._meta) || {};
      return !!r && !controllerOf(r) && !meta.occurrence && !meta.discussion;
    };
    async function offerForks() {
      let points;
      try { points = items(await api('GET', `/v1/runs/${enc(id)}/fork-points`)); } catch (_) { return; }
      points.filter((p) => p.reproducible).forEach((p) => {
        const li = timeline.querySelector(`[data-seq="${p.seq}"] .tl-head`);
        if (!li || li.querySelector('.fork')) return;
        li.append(h('button', {
          class: 'btn small fork', testid: 'fork', 'data-seq': p.seq, title: `A new run from here: node ${p.node_id} runs again with the vars it had`,
          onclick: async (e) => {
            const text = prompt(`Fork from record #${p.seq} (node ${p.node_id}). Vars to change, as a JSON object:`, '{}');
            if (text == null) return;
            let vars;
            try { vars = JSON.parse(text || '{}'); } catch (err) { alert('Not JSON: ' + err.message); return; }
            e.target.disabled = true;
            try {
              const forked = await api('POST', `/v1/runs/${enc(id)}/fork`, { at: p.seq, vars });
              location.hash = runHref(forked.run_id);
            } catch (err) { alert(err.message); e.target.disabled = false; }
          },
        }, 'Fork from here'));
      });
    }
    async function start() {
      try {
        const [st, ledger] = await Promise.all([api('GET', '/v1/runs/' + enc(id)), api('GET', `/v1/runs/${enc(id)}/ledger`)]);
        if (ctl.signal.aborted) return;
        setRun(st);
        if (controllerOf(st)) { actCard.hidden = false; rawToggle.hidden = false; timeline.hidden = true; }
        api('GET', `/v1/runs/${enc(id)}/flow`).then((f) => { flow = f; drawFlow(); })
          .catch((e) => swap(flowBox, muted('No picture: ' + e.message)));
        loadChildren();
        items(ledger).forEach((r) => addRecord(r));
        if (!items(ledger).length) timeline.append(h('li', { class: 'muted tl-empty' }, 'No records yet.'));
        if (forkable(st)) offerForks();
      } catch (e) {
        if (ctl.signal.aborted) return;
        swap(head, e.status === 404 ? empty('No run with this id.', 'Check the id, or go back to ', link('#/runs', 'the runs'), '.') : errorBox(e));
        return;
      }
      let opened = 0;
      follow(() => `/v1/runs/${enc(id)}/ledger/stream` + (lastSeq != null ? '?after=' + lastSeq : ''), ctl.signal, {
        onOpen: () => {
          follow_.textContent = '● live';
          follow_.className = 'live-small on';
          if (opened++) reloadState();
        },
        onDrop: () => { follow_.textContent = 'reconnecting…'; follow_.className = 'live-small'; },
        onGone: () => { follow_.textContent = 'not found'; },
        done: () => ended,
        onEvent: (ev) => {
          const data = parse(ev.data);
          if (ev.event === 'record' && data) {
            const empty_ = timeline.querySelector('.tl-empty');
            if (empty_) empty_.remove();
            addRecord(data, ev.id);
            // New records may be new fork points: look again, at most once a second.
            if (forkable(run) && !forksSoon) forksSoon = setTimeout(() => { forksSoon = null; offerForks(); }, 1000);
          } else if (ev.event === 'state' && data) setRun(data);
          else if (ev.event === 'end') {
            ended = true;
            loadChildren();
            follow_.textContent = 'run ended';
            follow_.className = 'live-small';
            reloadState();
            if (forkable(run)) offerForks();
            return false;
          }
          return true;
        },
      });
    }
    start();
    return { cleanup: () => { ctl.abort(); clearTimeout(drawSoon); clearTimeout(childrenSoon); } };
  }

  // ---------- Automations ----------
  // A trigger in a few words: a schedule's period, a connection, else the
  // source and how many settings it has (the whole config is in the
  // definition and the tooltip).
  function triggerText(t) {
    if (!t) return '—';
    const c = t.config || {};
    const n = Object.keys(c).length;
    const what = c.every ? `every ${c.every}` : c.at ? `at ${c.at}` : c.cron ? `cron ${c.cron}`
      : c.connection_id ? `connection ${clip(String(c.connection_id), 12)}` : n ? plural(n, 'setting') : '';
    return `${t.source_id}@${t.source_version}${what ? ' · ' + what : ''}`;
  }
  const triggerCell = (t) => h('span', { class: 'mono trigger', title: t ? JSON.stringify(t.config || {}) : '' }, triggerText(t));
  function heldBox(held) {
    if (!held) return null;
    return h('div', { class: 'msg warn', testid: 'held' }, `Held: the controller's step failed ${held.failures || '?'} time(s); next try `,
      ts(held.retry_at), '. ', held.error || '');
  }
  function automationsView() {
    const ctl = new AbortController();
    const table = h('div', { class: 'table-wrap' });
    add(app, h('div', { testid: 'automations-page' },
      pageHead('Automations', 'Workflows fired again and again by a trigger. Each firing is an occurrence.'), table));
    async function refresh() {
      try {
        const data = await api('GET', '/v1/automations?limit=200');
        if (ctl.signal.aborted) return;
        const list = items(data);
        if (!list.length) {
          swap(table, empty('No automations yet.', 'Create one from a shell: ', h('code', null, 'stepwell automations create --request @request.json'),
            ', or POST the request to ', h('code', null, '/v1/automations'), ' (see docs/automations.md).'));
          return;
        }
        swap(table, h('table', { class: 'grid', testid: 'automations-table' },
          h('thead', null, h('tr', null, ['Automation', 'Status', 'Trigger', 'Next fire', 'Occurrences', 'Last outcome'].map((t) => h('th', null, t)))),
          h('tbody', null, list.map((a) => h('tr', {
            class: 'clickable', testid: 'automation-row', 'data-automation-id': a.automation_id, 'data-status': a.status,
            onclick: (e) => { if (!e.target.closest('a')) location.hash = autoHref(a.automation_id); },
          },
          h('td', null, h('div', null, link(autoHref(a.automation_id), h('strong', null, a.title || '(untitled)'))), idText(a.automation_id),
            a.held ? h('div', { class: 'err-sum', title: a.held.error || '' }, `⚠ held after ${plural(a.held.failures, 'failed try', 'failed tries')}`) : null),
          h('td', null, badge(a.status)),
          h('td', null, triggerCell(a.trigger)),
          h('td', null, a.next_fire_at ? ts(a.next_fire_at, true) : muted('—')),
          h('td', { class: 'num' }, a.occurrence_count == null ? '0' : String(a.occurrence_count),
            a.current_occurrence ? h('div', null, tag('#' + a.current_occurrence.index + ' ' + a.current_occurrence.status, 't-run')) : null),
          h('td', null, outcomeText(a.last_outcome)))))));
      } catch (e) {
        if (!ctl.signal.aborted) swap(table, errorBox(e));
      }
    }
    refresh();
    const timer = setInterval(refresh, 30000); // the stream refreshes on every commit; this catches what time alone changes
    return { cleanup: () => { ctl.abort(); clearInterval(timer); }, refresh };
  }
  function outcomeText(o) {
    if (!o) return muted('—');
    if (typeof o !== 'object') return String(o);
    return h('span', null, o.status ? badge(o.status) : null, ' ', o.index != null ? muted('#' + o.index + ' ') : null,
      o.finished_at ? ts(o.finished_at) : null);
  }
  const ackKey = (id) => 'stepwell.ack.' + id;
  const seqOf = (item) => {
    const m = /:(\d+)$/.exec(item.cursor || '');
    return m ? Number(m[1]) : Number(item.seq || 0);
  };

  function automationView(id) {
    const ctl = new AbortController();
    let showAll = false;
    let busy = false;
    let generation = 0;
    const head = h('div', { class: 'card' });
    const cmdMsg = h('p', { class: 'msg', testid: 'cmd-result', hidden: true });
    const def = h('div');
    const waits = h('section', { class: 'card' });
    const attention = h('section', { class: 'card' });
    const occ = h('section', { class: 'card', testid: 'occurrences' });
    const cmds = [['pause', 'Pause', 'cmd-pause'], ['resume', 'Resume', 'cmd-resume'], ['run_now', 'Run now', 'cmd-run-now'], ['stop_current', 'Stop current', 'cmd-stop-current']]
      .map(([type, label, testid]) => h('button', { class: 'btn', testid, 'data-cmd': type, onclick: () => command(type, label) }, label));
    add(app, h('div', { testid: 'automation-page', 'data-automation-id': id },
      h('div', { class: 'crumbs' }, link('#/automations', 'Automations'), ' / ', mono(id)),
      head, h('div', { class: 'card cmd-bar' }, h('div', { class: 'row' }, cmds), cmdMsg),
      h('div', { class: 'cols' }, h('div', null, waits, attention), h('div', null, def)), occ));

    async function command(type, label) {
      cmds.forEach((b) => { b.disabled = true; });
      msg(cmdMsg, `${label}: sending…`, 'info');
      try {
        const ans = await api('POST', `/v1/automations/${enc(id)}/commands`, { type, command_id: uuid(), actor: 'dashboard' }, [422]);
        if (ans && ans.status === 'applied') msg(cmdMsg, `${label}: applied${ans.duplicate ? ' (duplicate)' : ''}.`, 'ok');
        else {
          const e = (ans && ans.error) || {};
          msg(cmdMsg, `${label}: rejected: ${e.reason_code || e.code || 'error'}${e.field ? ' (' + e.field + ')' : ''}: ${e.message || ''}`, 'err');
        }
        cmdMsg.dataset.status = ans && ans.status;
      } catch (e) {
        msg(cmdMsg, `${label}: ${e.message}`, 'err');
      }
      // The buttons stay off until the state the command left is shown.
      if (!(await refresh(true))) unblock();
    }
    function renderHead(a) {
      const d = a.definition || {};
      const cur = a.current_occurrence;
      swap(head,
        h('div', { class: 'page-head' }, h('div', null, h('h1', null, d.title || '(untitled)', ' ', badge(a.status, 'automation-status'))),
          h('div', { class: 'head-right' }, muted('revision ', String(a.active_revision || d.revision || '?')))),
        h('dl', { class: 'meta' },
          h('dt', null, 'Automation id'), h('dd', null, link(runHref(id), idText(id))),
          h('dt', null, 'Next fire'), h('dd', { testid: 'next-fire' }, a.next_fire_at ? ts(a.next_fire_at, true) : muted(a.status === 'paused' ? 'paused: nothing fires' : '—')),
          h('dt', null, 'In flight'), h('dd', null, cur ? h('span', null, `#${cur.index} ${cur.status}, attempt ${cur.attempt} `, cur.run_id ? link(runHref(cur.run_id), idText(cur.run_id)) : null) : muted('nothing')),
          h('dt', null, 'Trigger'), h('dd', null, triggerCell(d.trigger))),
        heldBox(a.held),
        a.error ? h('div', { class: 'msg err' }, String(a.error)) : null);
      setButtons(a);
    }
    // Each button is enabled only when its command can apply now.
    let shown = null;
    function setButtons(a) {
      shown = a;
      const cur = a.current_occurrence;
      const st = a.state || {};
      const why = {
        pause: a.status === 'active' ? null : `it is ${a.status}, not active`,
        resume: a.status === 'paused' ? null : `it is ${a.status}, not paused`,
        run_now: !['active', 'paused'].includes(a.status) ? `it is ${a.status}`
          : st.exhausted ? 'its trigger will not fire again'
            : cur || st.pending_occurrence || st.manual_pending ? 'an occurrence is in flight or about to start' : null,
        stop_current: cur ? null : 'no occurrence is in flight',
      };
      for (const b of cmds) {
        const t = b.dataset.cmd;
        b.disabled = !!why[t];
        b.title = why[t] ? `Not now: ${why[t]}.` : '';
        b.classList.toggle('primary', (t === 'resume' && a.status === 'paused') || (t === 'pause' && a.status === 'active'));
      }
    }
    function unblock() {
      if (shown) setButtons(shown);
      else cmds.forEach((b) => { b.disabled = false; });
    }
    function renderDef(a) {
      const d = a.definition || {};
      const tg = d.target || {};
      const pol = d.policy || {};
      const retry = pol.retry || {};
      const rows = [
        ['Target workflow', mono(tg.workflow_id || '—')],
        ['Flow', mono(tg.flow_id || '—')],
        ['Bundle', mono(tg.bundle_ref || '—')],
        ['Schedule', mono(triggerText(d.trigger))],
        d.trigger && d.trigger.config && d.trigger.config.start_at && ['Starts', ts(d.trigger.config.start_at, true)],
        ['Context', (d.context && d.context.mode) || 'independent'],
        ['Retry', retry.max_attempts ? `${plural(retry.max_attempts, 'attempt')}, backoff ${(retry.backoff || {}).initial || '?'} ×${(retry.backoff || {}).factor || '?'} up to ${(retry.backoff || {}).max || '?'}` : '—'],
        ['Tool approval', pol.tool_approval || '—'],
        ['Workspace', mono(d.workspace_root || '—')],
        ['Created', ts(d.created_at, true)],
      ].filter(Boolean);
      swap(def, h('section', { class: 'card' }, h('h2', null, 'Definition'),
        h('dl', { class: 'meta one' }, rows.map(([k, v]) => [h('dt', null, k), h('dd', null, v)])),
        fold('input', 'Input data', jsonBlock(tg.input_data || {})),
        fold('def', 'Full definition (JSON)', jsonBlock(d))));
    }
    function renderWaits(list) {
      swap(waits, h('h2', null, 'Waiting on a person ', list.length ? h('span', { class: 'count' }, String(list.length)) : null),
        list.length ? h('ul', { class: 'plain' }, list.map((w) => h('li', { class: 'wait-row', testid: 'automation-wait' },
          tag({ tool_approval: 'approval', ask_user: 'question' }[w.kind] || w.kind || 'wait', 't-person'), ' ',
          muted(`occurrence #${w.index} `),
          w.prompt || (w.details && w.details.tool_calls ? w.details.tool_calls.map((c) => c.name).join(', ') : w.wait_key), ' ',
          h('a', { class: 'btn small', href: runHref(w.run_id), testid: 'automation-wait-link' }, 'Answer →'))))
          : h('p', { class: 'muted' }, 'No occurrence waits on a person right now.'));
    }
    function renderAttention(list) {
      const acked = localStorage.getItem(ackKey(id));
      const ackSeq = acked ? seqOf({ cursor: acked }) : 0;
      const shown = showAll ? list : list.filter((i) => seqOf(i) > ackSeq);
      const newCount = list.filter((i) => seqOf(i) > ackSeq).length;
      const ack = (item) => { localStorage.setItem(ackKey(id), item.cursor || 'att1:' + seqOf(item)); renderAttention(list); };
      swap(attention,
        h('div', { class: 'section-head' }, h('h2', null, 'Attention ', newCount ? h('span', { class: 'count' }, String(newCount)) : null),
          h('div', { class: 'row' },
            newCount ? h('button', { class: 'btn small', testid: 'attention-ack-all', onclick: () => ack(list[list.length - 1]) }, 'Acknowledge all') : null,
            h('label', { class: 'toggle' }, h('input', { type: 'checkbox', testid: 'attention-show-all', checked: showAll, onchange: (e) => { showAll = e.target.checked; renderAttention(list); } }), ' show all'))),
        shown.length ? h('ul', { class: 'plain attention' }, shown.slice().reverse().map((i) => h('li', { class: 'att-item' + (seqOf(i) <= ackSeq ? ' acked' : ''), testid: 'attention-item', 'data-kind': i.kind },
          h('div', { class: 'att-head' }, tag(i.kind, i.kind === 'failure' ? 't-fail' : 't-note'), h('strong', null, i.title || ''),
            h('span', { class: 'tl-time' }, i.index != null ? muted(`#${i.index} · `) : null, ts(i.at))),
          i.body ? h('p', { class: 'att-body' }, i.body) : null,
          h('div', { class: 'row' }, i.run_id ? link(runHref(i.run_id), 'run ', mono(i.run_id, 'short')) : null,
            seqOf(i) > ackSeq ? h('button', { class: 'btn small', testid: 'attention-ack', onclick: () => ack(i) }, 'Acknowledge') : muted('acknowledged')))))
          : h('p', { class: 'muted' }, list.length ? 'Everything is acknowledged. Tick "show all" to see past items.' : 'Nothing needs attention: failures and notifications of occurrences show up here.'));
    }
    function renderOcc(page) {
      const list = items(page);
      swap(occ, h('h2', null, 'Occurrences'),
        list.length ? h('div', { class: 'table-wrap' }, h('table', { class: 'grid', testid: 'occurrences-table' },
          h('thead', null, h('tr', null, ['#', 'Status', 'Attempts', 'Fired', 'Finished', 'Run'].map((t) => h('th', null, t)))),
          h('tbody', null, list.map((o) => h('tr', { testid: 'occurrence-row', 'data-index': o.index },
            h('td', { class: 'num' }, String(o.index)), h('td', null, badge(o.status)), h('td', { class: 'num' }, String(o.attempts == null ? '—' : o.attempts)),
            h('td', null, ts(o.fired_at, true)), h('td', null, ts(o.finished_at)),
            h('td', null, o.run_id ? link(runHref(o.run_id), idText(o.run_id)) : muted('—')))))))
          : h('p', { class: 'muted' }, 'No occurrence yet. It fires at the next trigger time, or press "Run now".'),
        page && page.next_cursor ? h('p', { class: 'muted small' }, 'Showing the latest 50.') : null);
    }
    async function attentionItems() {
      const acked = localStorage.getItem(ackKey(id));
      const after = showAll || !acked ? 0 : seqOf({ cursor: acked });
      let all = [];
      let cursor = null;
      for (let i = 0; i < 5; i++) {
        const q = new URLSearchParams({ limit: '200' });
        if (after) q.set('after_seq', String(after));
        if (cursor) q.set('cursor', cursor);
        const page = await api('GET', `/v1/automations/${enc(id)}/attention?${q}`);
        all = all.concat(items(page));
        cursor = page && page.next_cursor;
        if (!cursor) break;
      }
      return all;
    }
    // Whether the page now shows the automation as the store holds it.
    // `force`: even while another refresh is on its way (its answer may
    // predate a command).
    async function refresh(force) {
      if (busy && !force) return false;
      busy = true;
      const mine = ++generation;
      try {
        const [a, o, w, at] = await Promise.all([
          api('GET', '/v1/automations/' + enc(id)),
          api('GET', `/v1/automations/${enc(id)}/occurrences?limit=50`),
          api('GET', `/v1/automations/${enc(id)}/waits`),
          attentionItems()]);
        // Overtaken by a newer refresh: that one shows what is newer.
        if (ctl.signal.aborted || mine !== generation) return false;
        renderHead(a); renderDef(a); renderWaits(items(w)); renderAttention(at); renderOcc(o);
        return true;
      } catch (e) {
        if (ctl.signal.aborted) return false;
        if (e.status === 404) swap(head, empty('No automation with this id.', 'Back to ', link('#/automations', 'the automations'), '.'));
        else swap(head, errorBox(e));
        return false;
      } finally {
        if (mine === generation) busy = false;
      }
    }
    refresh();
    const timer = setInterval(refresh, 30000); // the stream refreshes on every commit; this catches what time alone changes
    return { cleanup: () => { ctl.abort(); clearInterval(timer); }, refresh, wantsRecords: true };
  }

  // ---------- Waits ----------
  function waitsView() {
    const ctl = new AbortController();
    const box = h('div');
    add(app, h('div', { testid: 'waits-page' },
      pageHead('Waiting on a person', 'Runs that ask a question or need a tool approval, oldest first. Open one to answer it.'), box));
    async function refresh() {
      try {
        const list = items(await api('GET', '/v1/waits'));
        if (ctl.signal.aborted) return;
        list.sort((a, b) => String(a.updated_at).localeCompare(String(b.updated_at)));
        if (!list.length) {
          swap(box, empty('Nobody is being waited on.', 'Runs that ask a person (', h('code', null, 'ask_user'),
            ') or want a tool call approved show up here.'));
          return;
        }
        swap(box, h('div', { class: 'wait-list' }, list.map((r) => {
          const w = r.waiting || {};
          const approval = isApproval(w);
          return h('section', { class: 'card wait-item', testid: 'wait-item', 'data-run-id': r.run_id },
            h('div', { class: 'section-head' },
              h('div', null, tag(approval ? 'tool approval' : 'question', 't-person'), ' ', mono(r.workflow_id, 'wf'), ' ', link(runHref(r.run_id), idText(r.run_id))),
              muted('waiting ', ts(r.updated_at))),
            approval ? h('ul', { class: 'plain' }, (w.details.tool_calls || []).map((c) => h('li', null, h('strong', { class: 'mono' }, c.name),
              fold('args-' + r.run_id + c.call_id, 'arguments', jsonBlock(c.arguments || {})))))
              : h('p', { class: 'prompt' }, w.prompt || w.wait_key,
                Array.isArray(w.choices) && w.choices.length ? muted('  choices: ' + w.choices.join(' / ')) : null),
            h('a', { class: 'btn primary small', href: runHref(r.run_id), testid: 'wait-open' }, approval ? 'Review →' : 'Answer →'));
        })));
      } catch (e) {
        if (!ctl.signal.aborted) swap(box, errorBox(e));
      }
    }
    refresh();
    return { cleanup: () => ctl.abort(), refresh };
  }

  // ---------- Workflows ----------
  // Deployed workflows, and one workflow's versions with their runs.
  function workflowsView(id) {
    const ctl = new AbortController();
    const box = h('div');
    add(app, h('div', { testid: 'workflows-page' },
      pageHead(id ? 'Workflow ' + id : 'Workflows', id
        ? 'Its deployed versions, oldest first, and their runs. A run keeps the version it started on.'
        : 'Deployed workflows and their latest versions. Deploy with stepwell deploy DIR.'), box));
    const runs = (m) => Object.keys(m || {}).length
      ? Object.entries(m).map(([k, v]) => v + ' ' + k).join(', ') : muted('none');
    const who = (v) => v.deployed_at ? [ts(v.deployed_at), v.deployed_by ? ' by ' + v.deployed_by : ''] : '';
    async function refresh() {
      try {
        if (id) {
          const r = await api('GET', '/v1/workflows/' + encodeURIComponent(id) + '/versions');
          if (ctl.signal.aborted) return;
          swap(box, h('section', { class: 'card' }, h('table', { class: 'grid', testid: 'versions' },
            h('thead', null, h('tr', null, ['version', 'digest', 'deployed', 'runs'].map((c) => h('th', null, c)))),
            h('tbody', null, (r.versions || []).map((v) => h('tr', { testid: 'version-row' },
              h('td', null, String(v.version.version)), h('td', null, mono(v.version.digest.slice(0, 12))),
              h('td', null, who(v.version)), h('td', null, runs(v.runs))))))));
          return;
        }
        const list = items(await api('GET', '/v1/workflows'));
        if (ctl.signal.aborted) return;
        if (!list.length) {
          swap(box, empty('Nothing is deployed yet.', 'Deploy a bundle with ', h('code', null, 'stepwell deploy DIR'), '.'));
          return;
        }
        swap(box, h('section', { class: 'card' }, h('table', { class: 'grid', testid: 'workflows' },
          h('thead', null, h('tr', null, ['workflow', 'latest', 'versions', 'deployed'].map((c) => h('th', null, c)))),
          h('tbody', null, list.map((w) => h('tr', { testid: 'workflow-row' },
            h('td', null, link('#/workflows/' + encodeURIComponent(w.workflow_id), w.workflow_id)),
            h('td', null, String(w.latest.version)), h('td', null, String(w.versions)), h('td', null, who(w.latest))))))));
      } catch (e) {
        if (!ctl.signal.aborted) swap(box, errorBox(e));
      }
    }
    refresh();
    return { cleanup: () => ctl.abort(), refresh };
  }

  // ---------- boot ----------
  if (token()) enter();
  else showLogin();
})();
