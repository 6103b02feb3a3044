// baton console: plain JavaScript, no build step, no dependencies.
//
// One server-sent event stream (/v1/console/events, read with fetch so that
// it can carry the Authorization header) brings the feed of the log and the
// state of workers and requests. When the frontend that serves it fails, the
// page tries the other frontends it learned of and resumes the feed after the
// last id it saw (Last-Event-ID), so nothing is missed or shown twice.
'use strict';

const $ = (s, el = document) => el.querySelector(s);
const KEY = 'baton.console.key';
const FEED_MAX = 500;

const st = {
  base: location.origin,     // the frontend this page talks to
  key: localStorage.getItem(KEY) || '',
  cursor: '',                // last feed id ("R.W")
  seen: new Set(),           // feed entries shown: "stream/seq"
  frontends: [],             // from state events
  extra: (new URLSearchParams(location.search).get('frontends') || '').split(',').filter(Boolean),
  workers: [], lost: [], requests: [], now: Date.now(), skew: 0, self: '',
  selected: '', timeline: null, tlTimer: 0, tlLoading: false, tlAt: 0,
  stream: null, rekey: false, // the event stream's AbortController; set when a new key restarts it
};

function headers(extra = {}) {
  const h = { ...extra };
  if (st.key) h.Authorization = 'Bearer ' + st.key;
  return h;
}

async function api(path, opts = {}) {
  return fetch(st.base + path, { cache: 'no-store', ...opts, headers: headers(opts.headers) });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const esc = (s) => String(s ?? '').replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));

function notice(msg) {
  const n = $('#notice');
  n.hidden = !msg;
  n.textContent = msg || '';
}

function setConn(up, text) {
  const c = $('#conn');
  c.className = 'conn ' + (up ? 'up' : 'down');
  c.textContent = text;
  c.dataset.frontend = up ? st.self : '';
  c.dataset.base = st.base;
}

// ---- the event stream, with fail-over ---------------------------------

async function run() {
  for (;;) {
    try {
      const h = headers({ Accept: 'text/event-stream' });
      if (st.cursor) h['Last-Event-ID'] = st.cursor;
      st.stream = new AbortController();
      const resp = await fetch(st.base + '/v1/console/events', { headers: h, cache: 'no-store', signal: st.stream.signal });
      if (resp.status === 401 || resp.status === 403) {
        setConn(false, 'not authorised');
        notice('This frontend wants an API key: enter it above.');
        await waitForKey();
        continue;
      }
      if (!resp.ok) throw new Error('HTTP ' + resp.status);
      notice('');
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          onBlock(buf.slice(0, i));
          buf = buf.slice(i + 2);
        }
      }
      throw new Error('the stream ended');
    } catch (e) {
      if (st.rekey) { st.rekey = false; continue; } // a new key: reconnect here, resuming
      setConn(false, 'lost ' + st.base.replace(/^https?:\/\//, '') + ' (' + e.message + '), reconnecting…');
      await failover();
    }
  }
}

let keyWaiter = null;
function waitForKey() { return new Promise((r) => { keyWaiter = r; }); }

// candidates lists the frontends to try, the current one first.
function candidates() {
  const urls = [st.base];
  for (const f of st.frontends) {
    const m = /^(.*):(\d+)$/.exec(f.addr || '');
    if (!m) continue;
    let host = m[1].replace(/^\[|\]$/g, '');
    if (host === '' || host === '::' || host === '0.0.0.0') host = location.hostname;
    else if (host.includes(':')) host = '[' + host + ']';
    urls.push(location.protocol + '//' + host + ':' + m[2]);
  }
  urls.push(...st.extra, location.origin);
  return [...new Set(urls)];
}

async function failover() {
  for (let round = 0; ; round++) {
    for (const u of candidates()) {
      try {
        const r = await fetch(u + '/live', { cache: 'no-store', signal: AbortSignal.timeout(1500) });
        if (r.ok) { st.base = u; return; }
      } catch (_) { /* try the next */ }
    }
    await sleep(Math.min(2000, 250 * (round + 1)));
  }
}

function onBlock(block) {
  let id = '', event = 'message', data = '';
  for (const line of block.split('\n')) {
    if (line.startsWith('id: ')) id = line.slice(4);
    else if (line.startsWith('event: ')) event = line.slice(7);
    else if (line.startsWith('data: ')) data += line.slice(6);
  }
  if (!data) return;
  const v = JSON.parse(data);
  if (event === 'feed') {
    if (id) st.cursor = id;
    addFeed(v);
  } else if (event === 'state') {
    st.now = Date.parse(v.now);
    st.skew = Date.now() - st.now;
    st.self = v.frontend;
    st.workers = v.workers || [];
    st.lost = v.lost_workers || [];
    st.requests = v.requests || [];
    st.frontends = v.frontends || [];
    setConn(true, 'live on ' + v.frontend + ' · ' + st.base.replace(/^https?:\/\//, ''));
    render();
  }
}

// ---- rendering ----------------------------------------------------------

function age(t) {
  if (!t) return '–';
  const s = Math.max(0, (st.now - Date.parse(t)) / 1000);
  if (s < 60) return s.toFixed(1) + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm' + String(Math.floor(s % 60)).padStart(2, '0') + 's';
  return Math.floor(s / 3600) + 'h' + String(Math.floor((s % 3600) / 60)).padStart(2, '0') + 'm';
}

function badge(s) { return `<span class="badge s-${esc(s)}">${esc(s === 'not_ready' ? 'not ready' : s)}</span>`; }

function render() {
  renderFrontends();
  renderWorkers();
  renderRequests();
}

function renderFrontends() {
  $('#frontends').innerHTML = 'frontends: ' + st.frontends.map((f) =>
    f.id === st.self ? `<b>${esc(f.id)}</b>` : esc(f.id)).join(', ');
}

// syncRows updates a table body to rows ({key, attrs, cells}) in place:
// rows and cells that did not change keep their nodes, so a button under
// the pointer survives the updates that arrive several times a second.
function syncRows(tbody, rows) {
  const old = new Map([...tbody.children].map((tr) => [tr.dataset.key, tr]));
  let prev = null;
  for (const r of rows) {
    let tr = old.get(r.key);
    if (!tr) { tr = document.createElement('tr'); tr.dataset.key = r.key; }
    old.delete(r.key);
    for (const [k, v] of Object.entries(r.attrs)) if (tr.getAttribute(k) !== v) tr.setAttribute(k, v);
    while (tr.children.length < r.cells.length) tr.appendChild(document.createElement('td'));
    while (tr.children.length > r.cells.length) tr.lastElementChild.remove();
    r.cells.forEach((h, i) => { const td = tr.children[i]; if (td.dataset.h !== h) { td.innerHTML = h; td.dataset.h = h; } });
    const at = prev ? prev.nextElementSibling : tbody.firstElementChild;
    if (at !== tr) tbody.insertBefore(tr, at);
    prev = tr;
  }
  for (const tr of old.values()) tr.remove();
}

// renderWorkers lists the live workers and, marked lost, those whose lease
// ended without their deregistering (for --console-lost-workers), by id.
function renderWorkers() {
  $('#workers-count').textContent = st.workers.length + ' live' + (st.lost.length ? ` · ${st.lost.length} lost` : '');
  const all = [...st.workers, ...st.lost].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  syncRows($('#workers tbody'), all.map((w) => {
    if (w.state === 'lost') {
      return { key: w.id, attrs: { 'data-worker': w.id, 'data-state': w.state, class: 'gone' }, cells: [
        `<b>${esc(w.id)}</b>`, badge(w.state) + (w.reason ? ` <small class="reason">${esc(w.reason)}</small>` : ''),
        esc(w.model), '–', '–', '–', `lost ${age(w.departed)} ago`, String(w.pid), esc(w.host)] };
    }
    const l = w.load || {};
    const kv = l.kv_blocks_total ? Math.round(100 * l.kv_blocks_used / l.kv_blocks_total) : 0;
    const state = w.state === 'not_ready' ? badge(w.state) + ` <small>${esc((w.reason || 'health checks failing').replace('_', ' '))}</small>` : badge(w.state);
    return { key: w.id, attrs: { 'data-worker': w.id, 'data-state': w.state, class: '' }, cells: [
      `<b>${esc(w.id)}</b>`, state, esc(w.model), String(l.active_requests || 0),
      `<span class="bar"><i style="width:${kv}%"></i></span>${l.kv_blocks_used || 0}/${l.kv_blocks_total || 0}`,
      String(l.queued_prefill_tokens || 0), `renewed ${age(w.lease_renewed)} ago · ttl ${esc(w.lease_ttl)}`,
      String(w.pid), esc(w.host)] };
  }));
}

function renderRequests() {
  const models = [...new Set(st.requests.map((r) => r.model).concat(st.workers.map((w) => w.model)))].sort();
  const sel = $('#f-model');
  const cur = sel.value;
  const want = ['', ...models];
  if ([...sel.options].map((o) => o.value).join('\n') !== want.join('\n')) {
    sel.innerHTML = want.map((m) => `<option value="${esc(m)}">${m ? esc(m) : 'any'}</option>`).join('');
    sel.value = cur;
  }
  const fm = sel.value, fs = $('#f-status').value;
  const rows = st.requests.filter((r) => (!fm || r.model === fm) && (!fs || r.status === fs));
  $('#requests-count').textContent = rows.length + ' of ' + st.requests.length;
  syncRows($('#requests tbody'), rows.map((r) => {
    const btns = inFlight(r.status) ? `<button data-action="stop" data-request="${esc(r.id)}">stop</button>
      <button class="danger" data-action="kill" data-request="${esc(r.id)}">kill</button>` : '';
    return { key: r.id, attrs: { 'data-request': r.id, 'data-status': r.status, class: r.id === st.selected ? 'sel' : '' }, cells: [
      `<a href="#${esc(r.id)}" data-open="${esc(r.id)}">${esc(r.id)}</a>`, esc(r.model),
      badge(r.status) + (r.finish_reason ? ' <small>' + esc(r.finish_reason) + '</small>' : ''),
      esc(r.worker || '–'), esc(r.owner), `${r.tokens}${r.max_tokens ? '/' + r.max_tokens : ''}`, String(r.attempts),
      (r.migrations ? String(r.migrations) : '') + (r.approximate ? ' <small title="a continuation was approximate: prefill the engine re-tokenized, or not shown exact">approx.</small>' : ''), age(r.accepted), btns] };
  }));
  if (st.selected) {
    const r = st.requests.find((x) => x.id === st.selected);
    if (r && st.timeline && r.seq !== st.timeline.seq && !st.tlLoading && Date.now() - st.tlAt > 1000) loadTimeline(st.selected);
  }
  renderTimelineActions();
}

// ---- tenants, polled (GET /v1/console/tenants) ------------------------

function left(w) {
  if (!w) return '–';
  const pct = w.limit ? Math.round(100 * w.remaining / w.limit * 10) : 0; // of the burst, a tenth of the minute's budget
  return `<span class="bar"><i style="width:${Math.min(100, pct)}%"></i></span>${w.remaining} <small>of ${w.limit}/min</small>`;
}

function bytes(n) {
  if (n >= 1 << 20) return (n / (1 << 20)).toFixed(1) + ' MiB';
  if (n >= 1 << 10) return (n / (1 << 10)).toFixed(1) + ' KiB';
  return n + ' B';
}

function renderTenants(rows) {
  syncRows($('#tenants tbody'), rows.map((t) => {
    const h = t.here || {};
    const throttled = Object.entries(h.throttled || {}).map(([k, v]) => `${v} <small>${esc(k)}</small>`).join(' ');
    const share = t.log_limit_bytes ? `<span class="bar"><i style="width:${Math.min(100, Math.round(100 * t.log_bytes / t.log_limit_bytes))}%"></i></span>${bytes(t.log_bytes)} <small>of ${bytes(t.log_limit_bytes)}</small>`
      : (t.log_share ? String(t.log_share) : '–');
    const conc = !t.concurrent ? '–' : t.open !== undefined ? `${t.open} <small>of ${t.concurrent}</small>`
      : `${t.open_here ?? 0} <small>of ${t.concurrent} here</small>`;
    return { key: t.tenant, attrs: { 'data-tenant': t.tenant, class: '' }, cells: [
      `<b>${esc(t.tenant)}</b>`, left(t.requests), left(t.tokens), conc, share, String(t.weight || 1),
      String(h.admitted || 0), throttled || '0', String(h.queued || 0), String(h.tokens || 0)] };
  }));
}

async function pollTenants() {
  for (;;) {
    try {
      const r = await api('/v1/console/tenants');
      if (r.ok) renderTenants((await r.json()).data || []);
    } catch (e) { /* the event stream's fail-over moves st.base to a live frontend */ }
    await sleep(2000);
  }
}

function inFlight(status) { return status === 'pending' || status === 'running'; }

// renderTimelineActions offers stop and kill for the open timeline only
// while its request is in flight: by the timeline as last loaded and by its
// row, whichever learns first that it finished.
function renderTimelineActions() {
  const row = st.requests.find((x) => x.id === st.selected);
  const live = !!st.timeline && st.timeline.request.id === st.selected &&
    inFlight(st.timeline.request.status) && (!row || inFlight(row.status));
  for (const b of document.querySelectorAll('[data-tl-action]')) b.hidden = !live;
}

function addFeed(e) {
  const k = e.stream + '/' + e.seq;
  if (st.seen.has(k)) return;
  st.seen.add(k);
  const li = document.createElement('li');
  li.dataset.kind = e.kind;
  li.dataset.seq = e.seq;
  li.dataset.stream = e.stream;
  li.dataset.time = e.time;
  [li.ms, li.ns] = timeKey(e.time);
  if (e.request_id) li.dataset.request = e.request_id;
  if (e.worker_id) li.dataset.worker = e.worker_id;
  const t = new Date(e.time).toISOString().slice(11, 23);
  const who = e.request_id ? `<a data-open="${esc(e.request_id)}">${esc(e.request_id)}</a>` : `<b>${esc(e.worker_id)}</b>`;
  li.innerHTML = `<time>${t}</time><span class="k k-${esc(e.kind)}">${esc(e.kind)}</span><span>${who} ${esc(e.summary)}</span>`;
  const feed = $('#feed');
  // Newest first, in time order whatever order entries come in (backlogs
  // of several streams, a resume on another frontend): before the first
  // entry that is not later than this one.
  let at = feed.firstElementChild;
  while (at && later(at, li)) at = at.nextElementSibling;
  feed.insertBefore(li, at);
  while (feed.children.length > FEED_MAX) {
    const last = feed.lastElementChild;
    st.seen.delete(last.dataset.stream + '/' + last.dataset.seq);
    last.remove();
  }
}

// timeKey is an event time (RFC 3339, to the nanosecond) as [ms, ns within the ms].
function timeKey(t) {
  const f = /\.(\d+)/.exec(t);
  return [Date.parse(t), f ? Number((f[1] + '000000000').slice(3, 9)) : 0];
}

// later reports whether feed entry a comes after b: a later event time, or
// the same time and a later sequence of the same stream.
function later(a, b) {
  if (a.ms !== b.ms) return a.ms > b.ms;
  if (a.ns !== b.ns) return a.ns > b.ns;
  return a.dataset.stream === b.dataset.stream && Number(a.dataset.seq) > Number(b.dataset.seq);
}

// ---- timeline -----------------------------------------------------------

async function openTimeline(id) {
  st.selected = id;
  st.timeline = null;
  renderTimelineActions();
  $('#timeline-panel').hidden = false;
  renderRequests();
  await loadTimeline(id);
}

async function loadTimeline(id) {
  st.tlLoading = true;
  st.tlAt = Date.now();
  try {
    const r = await api('/v1/console/requests/' + encodeURIComponent(id) + '/timeline');
    const doc = await r.json();
    if (!r.ok) { notice(doc.error ? doc.error.message : 'HTTP ' + r.status); return; }
    if (id !== st.selected) return;
    doc.seq = doc.timeline.length ? doc.timeline[doc.timeline.length - 1].seq : 0;
    const row = st.requests.find((x) => x.id === id);
    if (row) doc.seq = row.seq;
    st.timeline = doc;
    drawTimeline(doc);
    renderTimelineActions();
  } catch (e) {
    notice('could not load the timeline of ' + id + ': ' + e.message);
  } finally {
    st.tlLoading = false;
  }
}

function drawTimeline(doc) {
  const rq = doc.request, tl = doc.timeline;
  const panel = $('#timeline');
  panel.dataset.request = rq.id;
  panel.dataset.status = rq.status;
  $('#tl-title').textContent = `${rq.id} · ${rq.status}${rq.finish_reason ? ' (' + rq.finish_reason + ')' : ''} · ${rq.tokens_generated} tokens · owner ${rq.owner}`;
  const end = Math.max(0.001, ...tl.map((e) => e.since_accepted_seconds));
  const x = (s) => (100 * Math.max(0, s) / end).toFixed(2) + '%';
  const color = (k) => `var(--a${k % 5})`;
  // When each attempt started and closed, and what happened on the request lane.
  const routedAt = {}, closedAt = {}, marks = { req: [] };
  for (const e of tl) {
    const ev = e.event || {};
    const s = e.since_accepted_seconds;
    switch (e.type) {
      case 'baton.request.routed.v1': if (e.applied) routedAt[ev.attempt] = s; break;
      case 'baton.request.attempt_failed.v1':
        (marks[ev.attempt] ||= []).push({ s, cls: 'cut', text: `fence @${ev.offset}: ${ev.reason}`, e });
        if (e.applied) closedAt[ev.attempt] ??= s;
        break;
      case 'baton.request.migrated.v1':
        (marks[ev.from_attempt] ||= []).push({ s, cls: 'mig', text: `${ev.migration_type} migration, cut @${ev.cut} (${ev.reason})`, e });
        closedAt[ev.from_attempt] ??= s;
        break;
      case 'baton.request.completed.v1':
        if (e.applied) { (marks[ev.attempt] ||= []).push({ s, cls: 'end', text: 'completed: ' + ev.finish_reason, e }); closedAt[ev.attempt] ??= s; }
        break;
      case 'baton.request.accepted.v1': marks.req.push({ s, cls: 'att', text: 'accepted by ' + ev.frontend }); break;
      case 'baton.request.attached.v1': marks.req.push({ s, cls: 'att', text: `attached to ${ev.frontend} @${ev.offset}` }); break;
      case 'baton.request.cancelled.v1': marks.req.push({ s, cls: 'cut', text: 'cancel ' + ev.mode }); break;
      case 'baton.request.failed.v1': marks.req.push({ s, cls: 'cut', text: 'failed: ' + ev.code }); break;
    }
  }
  const mk = (m) => `<div class="mark ${m.cls}${m.s > 0.7 * end ? ' flip' : ''}" style="left:${x(m.s)}" title="${esc(m.e ? m.e.summary : m.text)}"><span>${esc(m.text)}</span></div>`;
  let html = `<div class="lane" data-lane="request"><div class="label"><b>request</b> ${esc(rq.model)}</div>
    <div class="track">${marks.req.map(mk).join('')}</div></div>`;
  for (const a of rq.attempts) {
    const from = routedAt[a.attempt] ?? 0;
    const to = closedAt[a.attempt] ?? end;
    const upto = a.closed ? a.cut : rq.tokens_generated;
    html += `<div class="lane" data-attempt="${a.attempt}" data-worker="${esc(a.worker_id)}" data-start="${a.start_offset}"${a.closed ? ` data-cut="${a.cut}"` : ''}>
      <div class="label"><b>attempt ${a.attempt}</b> · ${esc(a.worker_id)}<br><small>tokens ${a.start_offset}–${upto}${a.closed ? ' · cut @' + a.cut + ' (' + esc(a.close_reason) + ')' : ''}</small></div>
      <div class="track"><div class="seg" style="left:${x(from)};width:calc(${x(to)} - ${x(from)});background:${color(a.attempt)}"></div>
      ${(marks[a.attempt] || []).map(mk).join('')}</div></div>`;
  }
  const ticks = [0, .25, .5, .75, 1].map((f) => `<span style="left:${f * 100}%">${(f * end).toFixed(2)}s</span>`).join('');
  html += `<div class="axis"><div></div><div class="ticks">${ticks}</div></div>`;
  panel.innerHTML = html;

  // The text as it grew: each accepted token, coloured by the attempt that
  // produced it, with the time it was stored; a mark at every cut.
  const toks = [];
  for (const e of tl) {
    if (e.type !== 'baton.request.tokens.v1' || !e.applied) continue;
    const ev = e.event;
    (ev.tokens || []).forEach((t, i) => { const o = ev.offset + i; if (o < e.len && toks[o] === undefined) toks[o] = { t, k: ev.attempt, s: e.since_accepted_seconds }; });
  }
  if (!toks.length && doc.tokens) {
    // A compacted request: its deltas are folded into one record, so each
    // token is coloured by the attempt whose range holds it, at the time
    // of the record.
    const rec = tl.find((e) => e.type === 'baton.request.compacted.v1');
    const s = rec ? rec.since_accepted_seconds : end;
    doc.tokens.forEach((t, i) => {
      const a = rq.attempts.filter((a) => a.start_offset <= i && (!a.closed || i < a.cut)).pop();
      toks[i] = { t, k: a ? a.attempt : 0, s };
    });
  }
  const cuts = new Set(rq.attempts.filter((a) => a.closed).map((a) => a.cut));
  $('#tl-text').innerHTML = toks.map((o, i) => (cuts.has(i) ? '<span class="cutmark" title="cut">‖</span>' : '') +
    `<span style="color:${color(o.k)}" title="token ${i}, attempt ${o.k}, +${o.s.toFixed(3)}s">${esc(o.t)}</span>`).join('');
  $('#tl-events').innerHTML = tl.filter((e) => e.type !== 'baton.request.tokens.v1' || !e.applied).map((e) =>
    `<li class="${e.applied ? 'applied' : ''}">+${e.since_accepted_seconds.toFixed(3)}s #${e.seq} ${esc(e.subject)} ${esc(e.summary)}${e.note ? ' [' + esc(e.note) + ']' : ''}</li>`).join('');
  clearTimeout(st.tlTimer);
  if (inFlight(rq.status)) st.tlTimer = setTimeout(() => st.selected === rq.id && loadTimeline(rq.id), 1000);
}

async function cancel(id, mode) {
  try {
    const r = await api('/v1/requests/' + encodeURIComponent(id) + '/cancel', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ mode }),
    });
    if (!r.ok) {
      const doc = await r.json().catch(() => ({}));
      notice(`${mode} ${id}: ` + (doc.error ? doc.error.message : 'HTTP ' + r.status));
    }
  } catch (e) {
    notice(`${mode} ${id}: ${e.message}`);
  }
}

// ---- wiring -------------------------------------------------------------

document.addEventListener('click', (ev) => {
  const t = ev.target.closest('[data-open], [data-action], [data-tl-action], #tl-close');
  if (!t) return;
  ev.preventDefault();
  if (t.dataset.open) openTimeline(t.dataset.open);
  else if (t.dataset.action) cancel(t.dataset.request, t.dataset.action);
  else if (t.dataset.tlAction && st.selected) cancel(st.selected, t.dataset.tlAction);
  else if (t.id === 'tl-close') { st.selected = ''; $('#timeline-panel').hidden = true; renderRequests(); }
});
$('#f-model').addEventListener('change', renderRequests);
$('#f-status').addEventListener('change', renderRequests);
$('#key').value = st.key;
$('#keyform').addEventListener('submit', (ev) => {
  ev.preventDefault();
  st.key = $('#key').value.trim();
  if (st.key) localStorage.setItem(KEY, st.key); else localStorage.removeItem(KEY);
  if (keyWaiter) { keyWaiter(); keyWaiter = null; return; }
  if (st.stream) { st.rekey = true; st.stream.abort(); }
});
setInterval(() => { st.now = Date.now() - st.skew; renderWorkers(); }, 1000);
if (location.hash.length > 1) openTimeline(decodeURIComponent(location.hash.slice(1)));
run();
pollTenants();
