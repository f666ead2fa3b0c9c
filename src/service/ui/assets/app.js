// delayq dashboard: one page, no framework, no network beyond this service's own /v1 API.
// Every value from Redis is put into the page as text (textContent), never as markup.
'use strict';

const REFRESH_MS = 3000;
const state = { open: false, csrf: null, timer: null, route: '', queues: [] };

// ---------- small helpers ----------

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === false || v === null || v === undefined) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : String(kid));
  }
  return el;
}

function svg(tag, attrs, ...kids) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const kid of kids.flat()) if (kid) el.append(kid instanceof Node ? kid : String(kid));
  return el;
}

const main = () => document.getElementById('main');
const num = (n) => (n === null || n === undefined ? '–' : Number(n).toLocaleString('en-US'));

function dur(ms) {
  if (ms === null || ms === undefined) return '–';
  const a = Math.abs(ms);
  if (a < 1000) return `${Math.round(a)} ms`;
  if (a < 60000) return `${(a / 1000).toFixed(a < 10000 ? 1 : 0)} s`;
  if (a < 3600000) return `${Math.round(a / 60000)} min`;
  if (a < 86400000) return `${(a / 3600000).toFixed(1)} h`;
  return `${(a / 86400000).toFixed(1)} d`;
}

function when(ms) {
  if (ms === null || ms === undefined) return h('span', { class: 'muted' }, '–');
  const d = ms - Date.now();
  const text = Math.abs(d) < 1000 ? 'now' : d > 0 ? `in ${dur(d)}` : `${dur(d)} ago`;
  return h('time', { datetime: new Date(ms).toISOString(), title: new Date(ms).toISOString() }, text);
}

function badge(text, cls) {
  return h('span', { class: `badge ${cls || text}` }, text);
}

// A cancelled order's `cancelled` object as a sentence: "cancelled by event order.paid
// (pay-3, 2 min ago)", "cancelled by tag customer:7 (…)", "cancelled by id (…)": nodes.
function cancelledBy(c) {
  const what = c.reason === 'event' ? `cancelled by event ${c.event} (${c.event_id ? `${c.event_id}, ` : ''}`
    : c.reason === 'tag' ? `cancelled by tag ${c.tag} (` : 'cancelled by id (';
  return [what, when(c.at_ms), ')'];
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// Calls the /v1 API (or /ui/...) with the session cookie; changes carry the CSRF token.
async function api(method, path, body) {
  const opts = { method, headers: {}, credentials: 'same-origin' };
  if (body !== undefined) {
    opts.headers['content-type'] = 'application/json';
    opts.body = JSON.stringify(body);
  }
  if (method !== 'GET' && state.csrf) opts.headers['x-csrf-token'] = state.csrf;
  let r;
  try {
    r = await fetch(path, opts);
  } catch (e) {
    throw new ApiError(0, 'unreachable', 'delayq does not answer (is it running?)');
  }
  const text = await r.text();
  let v = null;
  try {
    v = text ? JSON.parse(text) : null;
  } catch (e) {
    v = null;
  }
  if (r.status === 401 && !path.startsWith('/ui/')) {
    signIn();
    throw new ApiError(401, 'unauthorized', 'signed out');
  }
  if (!r.ok) {
    const e = (v && v.error) || {};
    throw new ApiError(r.status, e.code || 'error', e.message || r.statusText);
  }
  return { value: v, text };
}

// The exact text of a JSON field's value in `text` (the payload byte for byte, since
// JSON.parse would round big numbers): scans the value after `"key":`.
function rawField(text, key) {
  const start = text.indexOf(`"${key}":`);
  if (start < 0) return null;
  let i = start + key.length + 3;
  const begin = i;
  let depth = 0;
  let inStr = false;
  for (; i < text.length; i++) {
    const c = text[i];
    if (inStr) {
      if (c === '\\') i++;
      else if (c === '"') inStr = false;
      continue;
    }
    if (c === '"') inStr = true;
    else if (c === '{' || c === '[') depth++;
    else if (c === '}' || c === ']') {
      if (depth === 0) break;
      depth--;
    } else if (c === ',' && depth === 0) break;
  }
  return text.slice(begin, i);
}

function banner(message) {
  const b = document.getElementById('banner');
  b.textContent = message || '';
  b.hidden = !message;
}

function showError(e) {
  if (e.code === 'unauthorized') return;
  if (e.status === 0) banner(e.message);
  else if (e.code === 'redis_unavailable' || e.code === 'request_timeout')
    banner('Redis is unreachable: what is shown may be out of date.');
  else if (e.status === 503) banner(`Unavailable: ${e.message}`);
  else banner(`Error: ${e.message}`);
}

function status(text) {
  document.getElementById('status').textContent = text;
}

// ---------- confirmation ----------

function confirmAction(text, okLabel) {
  const d = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = okLabel || 'Confirm';
  return new Promise((resolve) => {
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
    d.returnValue = 'cancel';
    d.showModal();
    document.getElementById('confirm-cancel').focus();
  });
}

// ---------- routing ----------

function route() {
  clearTimeout(state.timer);
  banner('');
  const hash = location.hash || '#/';
  const [path, query] = hash.slice(1).split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  state.route = hash;
  for (const a of document.querySelectorAll('nav a[data-nav]')) {
    const current = (parts[0] || 'overview') === a.dataset.nav;
    if (current) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const m = main();
  m.replaceChildren();
  if (parts[0] === 'queue' && parts[1]) queuePage(parts[1]);
  else if (parts[0] === 'dead' && parts[1]) deadPage(parts[1], params);
  else if (parts[0] === 'order') orderPage(params);
  else if (parts[0] === 'tags') tagsPage(params);
  else overviewPage();
}

// Runs `load` now and every REFRESH_MS while the page stays on this route; returns a
// function that runs it again at once (and restarts the period).
function every(load) {
  const hash = state.route;
  let round = 0;
  const tick = async (r) => {
    if (state.route !== hash || r !== round) return;
    try {
      await load();
      banner('');
      status(`Updated ${new Date().toLocaleTimeString()}`);
    } catch (e) {
      showError(e);
    }
    if (state.route === hash && r === round) state.timer = setTimeout(() => tick(r), REFRESH_MS);
  };
  tick(round);
  return () => { clearTimeout(state.timer); round += 1; tick(round); };
}

// ---------- sign-in ----------

function signIn() {
  clearTimeout(state.timer);
  document.getElementById('nav').hidden = true;
  const err = h('p', { class: 'error', role: 'alert', id: 'signin-error' });
  const input = h('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'current-password', required: true });
  const form = h('form', { class: 'card signin', id: 'signin' },
    h('h1', {}, 'Sign in'),
    h('p', { class: 'muted' }, 'Use one of the bearer tokens configured in http.tokens.'),
    h('label', { for: 'token' }, 'Token'), input, err,
    h('button', { type: 'submit', class: 'primary' }, 'Sign in'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    err.textContent = '';
    try {
      await api('POST', '/ui/login', { token: input.value });
      input.value = '';
      await start();
    } catch (e) {
      err.textContent = e.status === 401 ? 'That token is not accepted.' : e.message;
      input.select();
    }
  });
  main().replaceChildren(form);
  input.focus();
}

async function start() {
  const { value } = await api('GET', '/ui/session');
  state.open = value.open;
  state.csrf = value.csrf;
  if (!value.open && !value.signed_in) return signIn();
  document.getElementById('nav').hidden = false;
  document.getElementById('signout').hidden = value.open;
  route();
}

// ---------- overview ----------

function pauseButton(queue, group, paused) {
  const what = group ? `group ${group} of ${queue}` : `dispatch of ${queue}`;
  return h('button', {
    type: 'button',
    'aria-label': `${paused ? 'Resume' : 'Pause'} ${what}`,
    'data-pause': group ? `${queue}/${group}` : queue,
    onclick: async (ev) => {
      ev.target.disabled = true;
      try {
        await api('POST', `/v1/queues/${encodeURIComponent(queue)}:${paused ? 'resume' : 'pause'}`, group ? { group } : {});
        route();
      } catch (e) {
        showError(e);
        ev.target.disabled = false;
      }
    },
  }, paused ? 'Resume' : 'Pause');
}

function schedulePauseButton(queue, id, paused) {
  return h('button', {
    type: 'button',
    'aria-label': `${paused ? 'Resume' : 'Pause'} schedule ${id} of ${queue}`,
    'data-pause-schedule': id,
    onclick: async (ev) => {
      ev.target.disabled = true;
      try {
        await api('POST', `/v1/queues/${encodeURIComponent(queue)}/schedules/${encodeURIComponent(id)}:${paused ? 'resume' : 'pause'}`);
        route();
      } catch (e) {
        showError(e);
        ev.target.disabled = false;
      }
    },
  }, paused ? 'Resume' : 'Pause');
}

function queueRow(q) {
  const name = encodeURIComponent(q.queue);
  return h('tr', { 'data-queue': q.queue },
    h('th', { scope: 'row' }, h('a', { href: `#/queue/${name}` }, q.queue), ' ', q.paused ? badge('paused') : null),
    h('td', { class: 'num', 'data-field': 'scheduled' }, num(q.scheduled)),
    h('td', { class: 'num' + (q.overdue ? ' bad' : '') }, num(q.overdue)),
    h('td', { class: 'num' }, q.overdue ? dur(q.oldest_overdue_ms) : '–'),
    h('td', {}, when(q.next_due_at_ms)),
    h('td', { class: 'num' }, num(q.stream_length)),
    h('td', { class: 'num' }, q.dead ? h('a', { href: `#/dead/${name}`, class: 'bad' }, num(q.dead)) : '0'),
    h('td', {}, pauseButton(q.queue, null, q.paused)));
}

function groupRow(q, g) {
  return h('tr', { class: 'group', 'data-group': `${q.queue}/${g.group}` },
    h('td', {}, g.group, ' ', g.kind ? badge(g.kind) : null, ' ', g.paused ? badge('paused') : null),
    h('td', { colspan: 2 }, `pending ${num(g.pending)}`),
    h('td', {}, `lag ${num(g.lag)}`),
    h('td', {}, `${num(g.consumers)} consumer${g.consumers === 1 ? '' : 's'}`),
    h('td', { colspan: 2 }, g.idle_ms === null ? 'no reader' : `idle ${dur(g.idle_ms)}`),
    h('td', {}, pauseButton(q.queue, g.group, g.paused)));
}

// Updates `tbody` to `rows` (key -> row): an existing row keeps its element and only the
// cells whose content changed are replaced, so refreshes keep the keyboard focus.
function patchRows(tbody, rows) {
  const old = new Map();
  for (const tr of tbody.children) old.set(tr.dataset.key, tr);
  let prev = null;
  for (const [key, row] of rows) {
    row.dataset.key = key;
    let tr = old.get(key);
    if (tr && tr.children.length === row.children.length) {
      [...row.children].forEach((cell, i) => {
        if (tr.children[i].outerHTML !== cell.outerHTML) tr.children[i].replaceWith(cell);
      });
    } else {
      if (tr) tr.remove();
      tr = row;
    }
    old.delete(key);
    const next = prev ? prev.nextSibling : tbody.firstChild;
    if (next !== tr) tbody.insertBefore(tr, next);
    prev = tr;
  }
  for (const tr of old.values()) tr.remove();
}

function overviewPage() {
  const body = h('tbody', { id: 'queues-body' });
  const table = h('div', { class: 'scroll' }, h('table', { id: 'queues' },
    h('caption', {}, 'Every registered queue, with its consumer groups below it. Refreshed every few seconds.'),
    h('thead', {}, h('tr', {},
      ['Queue', 'Scheduled', 'Overdue', 'Oldest overdue', 'Next due', 'Stream', 'Dead', 'Dispatch']
        .map((t, i) => h('th', { scope: 'col', class: i && i < 7 && i !== 4 ? 'num' : null }, t)))),
    body));
  const empty = h('div', { class: 'card', id: 'empty', hidden: true },
    h('h2', {}, 'No queues yet'),
    h('p', {}, 'A queue exists once it is registered: run ', h('code', {}, 'delayq queue create order-close'),
      ', call ', h('code', {}, 'PUT /v1/queues/order-close'), ', or start ', h('code', {}, 'delayq serve'),
      ' with a handler for it.'));
  // Totals over every queue, then one page of queues (the API pages them by name).
  const summary = h('p', { id: 'summary', class: 'summary' });
  const pages = [];
  const prev = h('button', { type: 'button', id: 'prev-page', hidden: true }, 'Previous queues');
  const next = h('button', { type: 'button', id: 'next-page', hidden: true }, 'Next queues');
  const pager = h('div', { class: 'actions' }, prev, next);
  let after = null;
  let load = null;
  prev.addEventListener('click', () => { after = pages.pop() ?? null; load(); });
  next.addEventListener('click', () => { pages.push(after); after = next.dataset.after; load(); });
  main().append(h('h1', {}, 'Queues'), summary, empty, table, pager);
  load = every(async () => {
    const path = after === null ? '/v1/stats' : `/v1/stats?after=${encodeURIComponent(after)}`;
    const { value } = await api('GET', path);
    const t = value.summary;
    if (t) {
      summary.textContent = `${t.queues} queue${t.queues === 1 ? '' : 's'} (${t.paused} paused), ${t.groups} group${t.groups === 1 ? '' : 's'}: `
        + `${t.scheduled} scheduled, ${t.overdue} overdue, ${t.stream_length} in streams, ${t.pending} pending, ${t.dead} dead`;
    }
    state.queues = value.queues.map((q) => q.queue);
    empty.hidden = value.queues.length > 0 || after !== null;
    table.hidden = value.queues.length === 0;
    prev.hidden = pages.length === 0 && after === null;
    next.hidden = !value.next;
    if (value.next) next.dataset.after = value.next;
    const rows = [];
    for (const q of value.queues) {
      rows.push([`q:${q.queue}`, queueRow(q)]);
      for (const g of q.groups) rows.push([`g:${q.queue}/${g.group}`, groupRow(q, g)]);
    }
    patchRows(body, rows);
    if (!performance.getEntriesByName('overview-rendered').length) performance.mark('overview-rendered');
  });
}

// ---------- one queue: groups, timing, controls ----------

function chart(title, points, series, unit) {
  const W = 600, H = 170, L = 44, R = 8, T = 10, B = 22;
  let max = 0;
  for (const s of series) for (const p of points) if (p[s.key] !== null && p[s.key] > max) max = p[s.key];
  const top = max > 0 ? max * 1.1 : 1;
  const x = (i) => L + ((W - L - R) * i) / Math.max(points.length - 1, 1);
  const y = (v) => T + (H - T - B) * (1 - v / top);
  const lines = series.map((s, k) => {
    const pts = [];
    points.forEach((p, i) => {
      if (p[s.key] !== null && p[s.key] !== undefined) pts.push(`${x(i).toFixed(1)},${y(p[s.key]).toFixed(1)}`);
    });
    return pts.length ? svg('polyline', { class: `s${k}`, points: pts.join(' ') }) : null;
  });
  const last = points[points.length - 1] || {};
  const summary = series.map((s) => `${s.name} ${last[s.key] === null || last[s.key] === undefined ? 'none' : last[s.key].toFixed(1)} ${unit}`).join(', ');
  const graphic = svg('svg', { class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `${title}, last hour; now: ${summary}` },
    svg('line', { class: 'axis', x1: L, y1: H - B, x2: W - R, y2: H - B }),
    svg('line', { class: 'axis', x1: L, y1: T, x2: L, y2: H - B }),
    svg('text', { x: L - 4, y: T + 8, 'text-anchor': 'end' }, top.toFixed(top < 10 ? 1 : 0)),
    svg('text', { x: L - 4, y: H - B, 'text-anchor': 'end' }, '0'),
    svg('text', { x: L, y: H - 6 }, '−60 min'),
    svg('text', { x: W - R, y: H - 6, 'text-anchor': 'end' }, 'now'),
    lines);
  return h('figure', {}, h('figcaption', {}, `${title} (${unit})`), graphic,
    h('div', { class: 'legend' }, series.map((s, k) => h('span', { class: `s${k}` }, s.name))));
}

function queuePage(name) {
  const q = encodeURIComponent(name);
  const facts = h('dl', { class: 'facts card' });
  const groups = h('tbody');
  const levels = h('tbody');
  const charts = h('div', { class: 'charts' });
  const schedules = h('tbody');
  const schedulesTable = h('div', { class: 'scroll', hidden: true }, h('table', { id: 'schedules' },
    h('caption', {}, 'Recurring schedules of this queue: each tick is an ordinary order with the id <schedule>@<instant ms>.'),
    h('thead', {}, h('tr', {}, ['Schedule', 'Cron or every', 'Time zone', 'Next fire', 'Last fire', 'Ticks', 'Missed', 'State', '']
      .map((t, i) => h('th', { scope: 'col', class: i >= 5 ? 'num' : null }, t)))),
    schedules));
  const noSchedules = h('p', { class: 'muted', id: 'schedules-empty', hidden: true },
    'No recurring schedules. Add one with ', h('code', {}, 'delayq cron add ...'),
    ' or ', h('code', {}, `PUT /v1/queues/${name}/schedules/{id}`), '.');
  main().append(
    h('h1', {}, 'Queue ', h('span', { id: 'queue-name' }, name)),
    h('div', { class: 'actions' },
      h('a', { class: 'button', href: `#/dead/${q}` }, 'Dead letters'),
      h('a', { class: 'button', href: `#/order?queue=${q}` }, 'Look up an order'),
      h('a', { class: 'button', href: `#/tags?queue=${q}` }, 'Orders by tag')),
    facts,
    h('h2', {}, 'Consumer groups'),
    h('div', { class: 'scroll' }, h('table', { id: 'groups' },
      h('thead', {}, h('tr', {}, ['Group', 'Pending', 'Lag', 'Consumers', 'Idle', 'State', ''].map((t) => h('th', { scope: 'col' }, t)))),
      groups)),
    h('h2', {}, 'Backlog by priority'),
    h('div', { class: 'scroll' }, h('table', { id: 'priorities' },
      h('caption', {}, 'Dispatched orders of each priority level: in the streams, not yet read by some group, read and not yet acknowledged (summed over the groups).'),
      h('thead', {}, h('tr', {}, ['Priority', 'In the streams', 'Unread', 'Pending'].map((t, i) => h('th', { scope: 'col', class: i ? 'num' : null }, t)))),
      levels)),
    h('h2', {}, 'Recurring schedules'),
    noSchedules, schedulesTable,
    h('h2', {}, 'Last hour (this delayq process)'),
    charts);
  every(async () => {
    const [{ value: stats }, { value: timing }, { value: recurring }] = await Promise.all([
      api('GET', `/v1/queues/${q}/stats`),
      api('GET', `/v1/queues/${q}/timing`),
      api('GET', `/v1/queues/${q}/schedules`),
    ]);
    const s = stats.queues[0];
    facts.replaceChildren(
      h('dt', {}, 'Dispatch'), h('dd', {}, s.paused ? badge('paused') : badge('running', 'done'), ' ', pauseButton(s.queue, null, s.paused)),
      h('dt', {}, 'Scheduled'), h('dd', { id: 'fact-scheduled' }, num(s.scheduled)),
      h('dt', {}, 'Overdue'), h('dd', {}, num(s.overdue), s.overdue ? ` (oldest ${dur(s.oldest_overdue_ms)})` : ''),
      h('dt', {}, 'Next due'), h('dd', {}, when(s.next_due_at_ms)),
      h('dt', {}, 'In the stream'), h('dd', {}, num(s.stream_length)),
      h('dt', {}, 'Dead letters'), h('dd', {}, num(s.dead)),
      h('dt', {}, 'In the history'), h('dd', {}, num(s.history)));
    patchRows(groups, s.groups.map((g) => [g.group, h('tr', { 'data-group': g.group },
      h('th', { scope: 'row' }, g.group, g.kind ? ' ' : null, g.kind ? badge(g.kind) : null,
        g.keys_active ? ' ' : null, g.keys_active ? badge(`${num(g.keys_active)} keys, ${num(g.key_waiting || 0)} waiting`) : null),
      h('td', { class: 'num' }, num(g.pending)),
      h('td', { class: 'num' }, num(g.lag)),
      h('td', { class: 'num' }, num(g.consumers)),
      h('td', {}, g.idle_ms === null ? 'no reader' : dur(g.idle_ms)),
      h('td', {}, g.paused ? badge('paused') : badge('running', 'done')),
      h('td', {}, pauseButton(s.queue, g.group, g.paused)))]));
    patchRows(levels, s.priorities.map((p) => [p.priority, h('tr', { 'data-priority': p.priority },
      h('th', { scope: 'row' }, p.priority),
      h('td', { class: 'num' }, num(p.stream_length)),
      h('td', { class: 'num' }, num(p.unread)),
      h('td', { class: 'num' }, num(p.pending)))]));
    noSchedules.hidden = recurring.schedules.length > 0;
    schedulesTable.hidden = recurring.schedules.length === 0;
    patchRows(schedules, recurring.schedules.map((r) => [r.id, h('tr', { 'data-schedule': r.id },
      h('th', { scope: 'row' }, r.id),
      h('td', {}, r.cron !== null ? h('code', {}, r.cron) : `every ${r.every}`),
      h('td', {}, r.timezone),
      h('td', {}, r.next_ms === null ? h('span', { class: 'muted' }, r.paused ? 'paused' : 'ended') : when(r.next_ms)),
      h('td', {}, when(r.last_fired_ms)),
      h('td', { class: 'num' }, num(r.ticks)),
      h('td', { class: 'num', title: `missed-tick policy: ${r.missed}` }, num(r.missed_ticks), ' ', h('span', { class: 'muted' }, `(${r.missed.replace('_', ' ')})`)),
      h('td', {}, r.paused ? badge('paused') : badge('running', 'done')),
      h('td', {}, schedulePauseButton(r.queue, r.id, r.paused)))]));
    charts.replaceChildren(
      chart('Throughput', timing.points, [
        { key: 'scheduled_per_s', name: 'scheduled' },
        { key: 'dispatched_per_s', name: 'dispatched' },
        { key: 'acked_per_s', name: 'acknowledged' },
      ], 'per s'),
      chart('Lateness', timing.points, [
        { key: 'late_p50_ms', name: 'p50' },
        { key: 'late_p99_ms', name: 'p99' },
      ], 'ms'));
  });
}

// ---------- dead letters ----------

function deadPage(name, params) {
  const q = encodeURIComponent(name);
  const after = params.get('after');
  const group = params.get('group') || '';
  const notice = h('p', { class: 'notice', role: 'status', hidden: true });
  const body = h('tbody');
  const pager = h('div', { class: 'actions' });
  const filter = h('form', { class: 'inline', id: 'dead-filter' },
    h('label', { for: 'dead-group' }, 'Group', h('br'), h('input', { id: 'dead-group', name: 'group', value: group, placeholder: 'all groups' })),
    h('button', { type: 'submit' }, 'Filter'));
  filter.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const g = filter.group.value.trim();
    location.hash = `#/dead/${q}${g ? `?group=${encodeURIComponent(g)}` : ''}`;
  });
  const selected = () => [...body.querySelectorAll('input[type=checkbox]:checked')].map((c) => c.value);
  const act = (verb, all) => async () => {
    const ids = all ? [] : selected();
    if (!all && ids.length === 0) return banner('Select dead letters first.');
    const scope = all ? `all dead letters of ${name}${group ? ` in group ${group}` : ''}` : `${ids.length} dead letter${ids.length > 1 ? 's' : ''}`;
    const text = verb === 'replay'
      ? `Replay ${scope}? Each goes back to the group that failed it, starting again at attempt 1.`
      : `Purge ${scope}? They are deleted for good.`;
    if (!(await confirmAction(text, verb === 'replay' ? 'Replay' : 'Purge'))) return;
    try {
      const sel = all ? { all: true } : { entry_ids: ids };
      if (group) sel.group = group;
      const { value } = await api('POST', `/v1/queues/${q}/dead/${verb}`, sel);
      const n = verb === 'replay' ? value.replayed : value.purged;
      await load();
      notice.textContent = `${verb === 'replay' ? 'Replayed' : 'Purged'} ${n} dead letter${n === 1 ? '' : 's'}.`;
      notice.hidden = false;
    } catch (e) {
      showError(e);
    }
  };
  main().append(
    h('h1', {}, 'Dead letters of ', h('a', { href: `#/queue/${q}` }, name)),
    filter, notice,
    h('div', { class: 'actions' },
      h('button', { type: 'button', id: 'replay-selected', onclick: act('replay', false) }, 'Replay selected'),
      h('button', { type: 'button', id: 'purge-selected', onclick: act('purge', false) }, 'Purge selected'),
      h('button', { type: 'button', id: 'replay-all', onclick: act('replay', true) }, 'Replay all'),
      h('button', { type: 'button', id: 'purge-all', class: 'danger', onclick: act('purge', true) }, 'Purge all')),
    h('div', { class: 'scroll' }, h('table', { id: 'dead' },
      h('thead', {}, h('tr', {}, [h('th', { scope: 'col' }, h('span', { class: 'muted' }, 'Select')), ...['Order', 'Group', 'Attempts', 'Last error', 'Dead since', 'Entry'].map((t) => h('th', { scope: 'col' }, t))])),
      body)),
    pager);
  async function load() {
    const qs = new URLSearchParams({ limit: '50' });
    if (after) qs.set('after', after);
    if (group) qs.set('group', group);
    const { value } = await api('GET', `/v1/queues/${q}/dead?${qs}`);
    body.replaceChildren(...value.dead_letters.map((d) => h('tr', { 'data-entry': d.entry_id },
      h('td', {}, h('input', { type: 'checkbox', value: d.entry_id, 'aria-label': `Select dead letter of order ${d.id}` })),
      h('td', {}, h('a', { href: `#/order?queue=${q}&id=${encodeURIComponent(d.id)}` }, d.id)),
      h('td', {}, d.group),
      h('td', { class: 'num' }, num(d.attempts)),
      h('td', { class: 'wrap' }, d.last_error),
      h('td', {}, when(d.dead_at_ms)),
      h('td', {}, h('code', {}, d.entry_id)))));
    if (value.dead_letters.length === 0)
      body.append(h('tr', {}, h('td', { colspan: 7, class: 'muted' }, 'No dead letters.')));
    const base = `#/dead/${q}?${group ? `group=${encodeURIComponent(group)}&` : ''}`;
    pager.replaceChildren(...[
      after ? h('a', { class: 'button', href: base }, 'First page') : null,
      value.next ? h('a', { class: 'button', id: 'next-page', href: `${base}after=${encodeURIComponent(value.next)}` }, 'Next page') : null,
    ].filter(Boolean));
  }
  load().catch(showError);
}

// ---------- order lookup ----------

function orderPage(params) {
  const queueSel = h('select', { id: 'order-queue', name: 'queue', required: true });
  const idInput = h('input', { id: 'order-id', name: 'id', required: true, value: params.get('id') || '', autocomplete: 'off' });
  const result = h('section', { id: 'order-result', 'aria-live': 'polite' });
  const form = h('form', { class: 'inline card', id: 'order-form' },
    h('label', { for: 'order-queue' }, 'Queue', h('br'), queueSel),
    h('label', { for: 'order-id' }, 'Order id', h('br'), idInput),
    h('button', { type: 'submit', class: 'primary' }, 'Look up'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    location.hash = `#/order?queue=${encodeURIComponent(queueSel.value)}&id=${encodeURIComponent(idInput.value.trim())}`;
  });
  main().append(h('h1', {}, 'Order lookup'), form, result);
  api('GET', '/v1/queues').then(({ value }) => {
    const want = params.get('queue');
    queueSel.replaceChildren(...value.queues.map((n) => h('option', { value: n, selected: n === want }, n)));
    if (!value.queues.length) result.replaceChildren(h('p', { class: 'muted' }, 'No queues yet.'));
  }).catch(showError);
  const queue = params.get('queue');
  const id = params.get('id');
  if (!queue || !id) return idInput.focus();
  api('GET', `/v1/queues/${encodeURIComponent(queue)}/messages/${encodeURIComponent(id)}`).then(({ value: o, text }) => {
    const payload = rawField(text, 'payload');
    result.replaceChildren(
      h('h2', {}, 'Order ', h('code', {}, o.id), ' ', badge(o.state)),
      h('dl', { class: 'facts card', id: 'order-facts' },
        h('dt', {}, 'Queue'), h('dd', {}, o.queue),
        h('dt', {}, 'Due'), h('dd', {}, when(o.due_at_ms)),
        ...(o.cancelled ? [h('dt', {}, 'Cancelled'), h('dd', { id: 'order-cancelled' }, ...cancelledBy(o.cancelled))] : []),
        h('dt', {}, 'Dispatched'), h('dd', {}, o.dispatched_at_ms ? when(o.dispatched_at_ms) : '–'),
        h('dt', {}, 'Stream entry'), h('dd', {}, o.entry_id || '–'),
        h('dt', {}, 'Key'), h('dd', {}, o.key ? h('code', {}, o.key) : '–'),
        h('dt', {}, 'Tags'), h('dd', { id: 'order-tags' }, o.tags && o.tags.length
          ? o.tags.map((t) => h('a', { class: 'tag', href: `#/tags?tag=${encodeURIComponent(t)}&queue=${encodeURIComponent(o.queue)}` }, t))
          : '–')),
      h('h2', {}, 'Payload'),
      payload && payload !== 'null' ? h('pre', { id: 'order-payload' }, payload) : h('p', { class: 'muted' }, 'Not kept any more (the stream entry was trimmed).'),
      h('h2', {}, 'Groups'),
      o.groups.length
        ? h('div', { class: 'scroll' }, h('table', { id: 'order-groups' },
          h('thead', {}, h('tr', {}, ['Group', 'State', 'Attempts', 'Last error', 'Next attempt'].map((t) => h('th', { scope: 'col' }, t)))),
          h('tbody', {}, o.groups.map((g) => h('tr', { 'data-group': g.group },
            h('th', { scope: 'row' }, g.group),
            h('td', {}, badge(g.state)),
            h('td', { class: 'num' }, num(g.attempts)),
            h('td', { class: 'wrap' }, g.last_error || '–'),
            h('td', {}, g.next_attempt_at_ms ? when(g.next_attempt_at_ms) : '–'))))))
        : h('p', { class: 'muted' }, o.state === 'scheduled' ? 'Not dispatched yet: no group has it.'
          : o.state === 'cancelled' ? 'Cancelled before its due time: no group had it.' : 'No consumer group.'));
  }).catch((e) => {
    if (e.status === 404 && e.code === 'not_found')
      result.replaceChildren(h('p', { class: 'card', id: 'order-missing' }, `No order ${id} in ${queue}: never scheduled, cancelled or dispatched longer ago than the history retention, or cancelled while the queue kept no history.`));
    else showError(e);
  });
}

// ---------- boot ----------

document.addEventListener('DOMContentLoaded', () => {
  window.addEventListener('hashchange', () => {
    route();
    main().focus();
  });
  document.getElementById('signout').addEventListener('click', async () => {
    try {
      await api('POST', '/ui/logout');
    } finally {
      state.csrf = null;
      signIn();
    }
  });
  start().catch(showError);
});
