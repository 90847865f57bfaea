// Flotilla web console: a dependency-free single-page app served by the worker
// under a strict CSP (no inline script/style, no eval).
//
// Security rule for this file: everything the API returns is attacker-controlled.
// The DOM is only ever built with createElement / createElementNS, text goes in
// through text nodes, and attributes through setAttribute on safe names. There is
// no HTML parsing of data anywhere.
'use strict';

(() => {
  // ---------------------------------------------------------------------------
  // Constants and small utilities
  // ---------------------------------------------------------------------------

  const TOKEN_KEY = 'flotilla.token';
  // The scopes of the signed-in token (GET /v1/me): the console offers only
  // what the token may do; the API refuses the rest in any case.
  const SCOPES_KEY = 'flotilla.scopes';
  const STATUSES = ['QUEUED', 'RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'DEAD', 'CANCELLED'];
  const FINAL = new Set(['COMPLETED', 'FAILED', 'DEAD', 'CANCELLED']);
  const RETRYABLE = new Set(['DEAD', 'FAILED', 'CANCELLED']);
  const CANCELLABLE = new Set(['QUEUED', 'WAITING', 'RUNNING']);
  const FINISHED = ['COMPLETED', 'FAILED', 'DEAD', 'CANCELLED'];
  const SVG_NS = 'http://www.w3.org/2000/svg';

  const $ = (id) => document.getElementById(id);
  const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
  const pad = (n) => String(n).padStart(2, '0');

  /** Path segment for a URL built from data: never lets a value add segments or a query. */
  const seg = (v) => encodeURIComponent(String(v));

  // ---------------------------------------------------------------------------
  // Escaping-safe DOM helpers
  // ---------------------------------------------------------------------------

  // Properties set as DOM properties rather than attributes (they hold state).
  const PROPS = new Set(['value', 'checked', 'disabled', 'selected', 'hidden', 'open', 'readOnly']);

  /** Only same-document or same-origin links; anything else becomes inert. */
  function safeHref(v) {
    const s = String(v);
    return /^(#|\/(?!\/))/.test(s) ? s : '#';
  }

  function setAttrs(node, attrs) {
    if (!attrs) return;
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith('on')) {
        // Event handlers are attached as listeners, never as attribute strings.
        if (typeof v !== 'function') throw new TypeError(`handler ${k} must be a function`);
        node.addEventListener(k.slice(2), v);
      } else if (k === 'dataset') {
        for (const [dk, dv] of Object.entries(v)) node.dataset[dk] = String(dv);
      } else if (k === 'href') {
        node.setAttribute('href', safeHref(v));
      } else if (PROPS.has(k)) {
        node[k] = v;
      } else if (k === 'style' || k === 'srcdoc' || k === 'src') {
        throw new TypeError(`attribute ${k} is not allowed`);
      } else {
        node.setAttribute(k, v === true ? '' : String(v));
      }
    }
  }

  function appendChildren(node, children) {
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      if (Array.isArray(c)) appendChildren(node, c);
      else if (c instanceof Node) node.appendChild(c);
      else node.appendChild(document.createTextNode(String(c))); // text, never markup
    }
  }

  /** el('a', {href, class}, 'text', childNode, [more]) — string children become text nodes. */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    appendChildren(node, children);
    return node;
  }

  /** Same as el() in the SVG namespace. */
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k.startsWith('on') || k === 'style' || k === 'href') throw new TypeError(`svg attribute ${k} not allowed`);
      node.setAttribute(k, String(v));
    }
    appendChildren(node, children);
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  function replaceContent(node, ...children) {
    clear(node);
    appendChildren(node, children);
    return node;
  }

  function statusBadge(status, id) {
    const known = STATUSES.includes(status) ? status : 'UNKNOWN';
    return el('span', { class: `status status-${known}`, id }, String(status ?? '—'));
  }

  /** Collapsible pretty JSON: the <pre> is filled with textContent only. */
  function jsonBlock(id, title, value, open) {
    const pre = el('pre', { class: 'json' });
    const details = el('details', { id, class: 'json-block', open: !!open }, el('summary', null, title), pre);
    let last = null;
    const set = (v) => {
      const text = v === undefined ? 'null' : JSON.stringify(v, null, 2);
      if (text !== last) pre.textContent = text; // untouched when unchanged: keeps selection
      last = text;
    };
    set(value);
    return { node: details, set };
  }

  const dash = (v) => (v === null || v === undefined || v === '' ? '—' : String(v));

  // ---------------------------------------------------------------------------
  // Time formatting
  // ---------------------------------------------------------------------------

  function localTime(iso) {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function relAge(iso, now = Date.now()) {
    const t = Date.parse(iso);
    if (Number.isNaN(t)) return '';
    const s = Math.round((now - t) / 1000);
    const a = Math.abs(s);
    let txt;
    if (a < 5) return 'just now';
    if (a < 60) txt = `${a} s`;
    else if (a < 3600) txt = `${Math.floor(a / 60)} min`;
    else if (a < 86400) txt = `${Math.floor(a / 3600)} h ${Math.floor((a % 3600) / 60)} min`;
    else txt = `${Math.floor(a / 86400)} d ${Math.floor((a % 86400) / 3600)} h`;
    return s >= 0 ? `${txt} ago` : `in ${txt}`;
  }

  /** Local date-time plus an age that a global ticker keeps fresh. */
  function timeEl(iso) {
    if (iso === null || iso === undefined || iso === '') return el('span', { class: 'muted' }, '—');
    return el('span', { class: 'time' },
      el('time', { datetime: String(iso), title: String(iso) }, localTime(iso)),
      ' ',
      el('span', { class: 'age', dataset: { ts: String(iso) } }, relAge(iso)));
  }

  function refreshAges() {
    const now = Date.now();
    for (const n of document.querySelectorAll('.age[data-ts]')) n.textContent = relAge(n.dataset.ts, now);
  }

  /** ISO timestamp → value for <input type="datetime-local"> (local time). */
  function toLocalInput(iso) {
    const d = new Date(iso);
    if (!iso || Number.isNaN(d.getTime())) return '';
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }

  // ---------------------------------------------------------------------------
  // Error banner and busy indicator
  // ---------------------------------------------------------------------------

  function showError(message) {
    $('error-text').textContent = message;
    $('error').hidden = false;
  }

  function clearError() {
    $('error').hidden = true;
    $('error-text').textContent = '';
  }

  /** Shows an API or network failure; sign-outs are already handled by the client. */
  function report(err) {
    if (err && err.authFailed) return;
    showError(err && err.message ? err.message : String(err));
  }

  let inflight = 0;
  function busy(delta) {
    inflight = Math.max(0, inflight + delta);
    $('loading').hidden = inflight === 0;
  }

  // ---------------------------------------------------------------------------
  // API client
  // ---------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, problem, message) {
      super(message);
      this.status = status; // 0 for network failures
      this.problem = problem || {};
    }
  }

  const getToken = () => sessionStorage.getItem(TOKEN_KEY);

  /** Whether the signed-in token has `scope` (read, submit, answer, operate, define). */
  function can(scope) {
    try {
      const scopes = JSON.parse(sessionStorage.getItem(SCOPES_KEY) || 'null');
      return Array.isArray(scopes) && scopes.includes(scope);
    } catch {
      return false;
    }
  }

  /**
   * One request to the API. Resolves with the parsed JSON body; rejects with an
   * ApiError whose message is the problem's `detail`. A 401, or a 403 refusing the
   * token itself (not one naming a missing scope), drops the token and returns to
   * the sign-in form, unless `token` was given explicitly (sign-in).
   */
  async function api(method, path, { body, token, background } = {}) {
    const tok = token ?? getToken();
    const headers = { Accept: 'application/json' };
    if (tok) headers.Authorization = `Bearer ${tok}`;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    if (!background) busy(1);
    let res;
    try {
      res = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        credentials: 'omit', // the bearer header is the only credential
        cache: 'no-store',
        redirect: 'error',
      });
    } catch (e) {
      throw new ApiError(0, null, `Network error: cannot reach the API (${e.message})`);
    } finally {
      if (!background) busy(-1);
    }
    let data = null;
    const text = await res.text();
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = null;
      }
    }
    if (res.ok) return data;
    const problem = isObject(data) ? data : {};
    const detail = typeof problem.detail === 'string' && problem.detail
      ? problem.detail
      : `${res.status} ${problem.title || res.statusText || 'error'}`;
    const err = new ApiError(res.status, problem, detail);
    const refusedToken = res.status === 401 || (res.status === 403 && !problem.missing_scope);
    if (refusedToken && token === undefined) {
      signOut(detail);
      err.authFailed = true;
    }
    throw err;
  }

  function query(params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
    const s = q.toString();
    return s ? `?${s}` : '';
  }

  // ---------------------------------------------------------------------------
  // Auth
  // ---------------------------------------------------------------------------

  function showSignIn(message) {
    stopView();
    $('view').hidden = true;
    $('nav').hidden = true;
    $('sign-out').hidden = true;
    $('sign-in-view').hidden = false;
    const errEl = $('sign-in-error');
    errEl.textContent = message || '';
    errEl.hidden = !message;
    $('token').value = '';
    $('token').focus();
    document.title = 'Sign in · Flotilla';
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(SCOPES_KEY);
    clearError();
    showSignIn(message);
  }

  function showApp() {
    $('sign-in-view').hidden = true;
    $('view').hidden = false;
    $('nav').hidden = false;
    $('sign-out').hidden = false;
  }

  async function onSignIn(ev) {
    ev.preventDefault();
    const token = $('token').value.trim();
    const errEl = $('sign-in-error');
    if (!token) {
      errEl.textContent = 'Enter a token.';
      errEl.hidden = false;
      return;
    }
    $('sign-in').disabled = true;
    try {
      // Check the token, and learn what it may do, before keeping it.
      const me = await api('GET', '/v1/me', { token });
      const scopes = isObject(me) && Array.isArray(me.scopes) ? me.scopes : [];
      if (!scopes.includes('read')) throw new Error('This token cannot read jobs (it lacks the `read` scope), so the console has nothing to show.');
      sessionStorage.setItem(TOKEN_KEY, token);
      sessionStorage.setItem(SCOPES_KEY, JSON.stringify(scopes));
      errEl.hidden = true;
      showApp();
      if (!location.hash || location.hash === '#' || location.hash === '#/') location.hash = '#/jobs';
      else route();
    } catch (e) {
      errEl.textContent = e.message;
      errEl.hidden = false;
    } finally {
      $('sign-in').disabled = false;
    }
  }

  // ---------------------------------------------------------------------------
  // In-page confirmation dialog (the native confirm box is blocking and unstyled)
  // ---------------------------------------------------------------------------

  let confirmResolve = null;

  /** Resolves with {reason} when confirmed, null when dismissed. */
  function confirmAction({ title, message, yes, askReason }) {
    const dlg = $('confirm');
    $('confirm-title').textContent = title;
    $('confirm-message').textContent = message;
    $('confirm-yes').textContent = yes;
    $('confirm-reason-row').hidden = !askReason;
    $('confirm-reason').value = '';
    dlg.returnValue = '';
    return new Promise((resolve) => {
      confirmResolve = resolve;
      dlg.showModal();
      (askReason ? $('confirm-reason') : $('confirm-no')).focus();
    });
  }

  function initConfirm() {
    const dlg = $('confirm');
    $('confirm-yes').addEventListener('click', () => dlg.close('yes'));
    $('confirm-no').addEventListener('click', () => dlg.close('no'));
    $('confirm-reason').addEventListener('keydown', (e) => {
      if (e.key === 'Enter') dlg.close('yes');
    });
    // 'close' also fires on Escape, so every way out resolves the promise.
    dlg.addEventListener('close', () => {
      const r = confirmResolve;
      confirmResolve = null;
      if (r) r(dlg.returnValue === 'yes' ? { reason: $('confirm-reason').value.trim() } : null);
    });
  }

  // ---------------------------------------------------------------------------
  // Router and view lifecycle
  // ---------------------------------------------------------------------------

  // Each rendered view gets a context; leaving the view kills it so late
  // responses and timers of the old view cannot touch the new one.
  let current = null;

  function newContext() {
    const ctx = {
      alive: true,
      timers: new Set(),
      /** Runs fn every ms (after the previous run finished), skipping hidden tabs. */
      every(ms, fn) {
        let failed = false;
        const loop = () => {
          const t = setTimeout(async () => {
            ctx.timers.delete(t);
            if (!ctx.alive) return;
            if (!document.hidden) {
              try {
                await fn();
                // The banner this loop raised is stale once a refresh works again.
                if (failed && ctx.alive) clearError();
                failed = false;
              } catch (e) {
                if (ctx.alive) report(e);
                failed = true;
              }
            }
            if (ctx.alive) loop();
          }, ms);
          ctx.timers.add(t);
        };
        loop();
      },
    };
    return ctx;
  }

  function stopView() {
    if (!current) return;
    current.alive = false;
    for (const t of current.timers) clearTimeout(t);
    current.timers.clear();
    current = null;
  }

  function parseHash() {
    const raw = location.hash.replace(/^#/, '');
    const qi = raw.indexOf('?');
    const pathPart = qi >= 0 ? raw.slice(0, qi) : raw;
    const params = new URLSearchParams(qi >= 0 ? raw.slice(qi + 1) : '');
    const parts = pathPart.split('/').filter(Boolean).map((p) => decodeURIComponent(p));
    return { parts, params };
  }

  /** Sets the hash, or re-renders when it is already the same. */
  function navigate(hash) {
    if (location.hash === hash) route();
    else location.hash = hash;
  }

  function route() {
    if (!getToken()) {
      showSignIn();
      return;
    }
    showApp();
    let parsed;
    try {
      parsed = parseHash();
    } catch {
      parsed = { parts: ['?'], params: new URLSearchParams() };
    }
    const { parts, params } = parsed;
    if (parts.length === 0) {
      location.replace('#/jobs');
      return;
    }
    stopView();
    clearError();
    const ctx = (current = newContext());
    const view = $('view');
    replaceContent(view, el('p', { class: 'loading' }, 'Loading…'));
    for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.nav === parts[0]);

    const [section, arg, extra] = parts;
    let render;
    if (section === 'jobs' && arg === undefined) render = () => jobsView(ctx, view, params);
    else if (section === 'jobs' && extra === undefined) render = () => jobView(ctx, view, arg);
    else if (section === 'waiting' && arg === undefined) render = () => waitingView(ctx, view);
    else if (section === 'waiting' && extra === undefined) render = () => answerView(ctx, view, arg);
    else if (section === 'workflows' && arg === undefined) render = () => workflowsView(ctx, view);
    else if (section === 'workflows' && extra === undefined) render = () => workflowView(ctx, view, arg, params);
    else if (section === 'schedules' && arg === undefined) render = () => schedulesView(ctx, view);
    else if (section === 'fleet' && arg === undefined) render = () => fleetView(ctx, view);
    else {
      document.title = 'Not found · Flotilla';
      replaceContent(view, el('h1', null, 'Not found'), el('p', null, 'No such page. ', el('a', { href: '#/jobs' }, 'Go to jobs')));
      return;
    }
    Promise.resolve()
      .then(render)
      .catch((e) => {
        if (!ctx.alive || e.authFailed) return;
        report(e);
        replaceContent(view, el('p', { class: 'view-error', role: 'alert' }, e.message || String(e)));
      });
  }

  function page(title, ...children) {
    document.title = `${title} · Flotilla`;
    return children;
  }

  // ---------------------------------------------------------------------------
  // View: Jobs
  // ---------------------------------------------------------------------------

  const JOB_FILTERS = ['status', 'workflow_name', 'created_after', 'created_before', 'metadata', 'limit'];

  function jobRow(job) {
    const id = String(job.job_id);
    return el('tr', { class: 'job-row', dataset: { jobId: id } },
      el('td', { class: 'mono' }, el('a', { class: 'job-link', href: `#/jobs/${seg(id)}` }, id)),
      el('td', null, dash(job.workflow_name)),
      el('td', { class: 'cell-status' }, statusBadge(job.status)),
      el('td', { class: 'cell-attempt num' }, `${job.attempt ?? '—'}/${job.max_attempts ?? '—'}`),
      el('td', null, timeEl(job.created_at)),
      el('td', { class: 'cell-updated' }, timeEl(job.updated_at)));
  }

  // `key=value, key=value` as the JSON object the API filters by ('' for none).
  function metadataFilter(text) {
    const entries = {};
    for (const part of String(text).split(',')) {
      const at = part.indexOf('=');
      if (at > 0) entries[part.slice(0, at).trim()] = part.slice(at + 1).trim();
    }
    return Object.keys(entries).length ? JSON.stringify(entries) : '';
  }

  async function jobsView(ctx, view, params) {
    const filters = {};
    for (const k of JOB_FILTERS) if (params.get(k)) filters[k] = params.get(k);

    // --- filter form: values come from the hash so a reload keeps them
    const statusSel = el('select', { id: 'filter-status', name: 'status' },
      el('option', { value: '' }, 'any'),
      STATUSES.map((s) => el('option', { value: s, selected: filters.status === s }, s)));
    const wfInput = el('input', { id: 'filter-workflow', type: 'text', value: filters.workflow_name || '', placeholder: 'workflow name' });
    const afterInput = el('input', { id: 'filter-after', type: 'datetime-local', value: toLocalInput(filters.created_after) });
    const beforeInput = el('input', { id: 'filter-before', type: 'datetime-local', value: toLocalInput(filters.created_before) });
    // Labels as `key=value, key=value`; the API takes them as a JSON object.
    const labelsOf = (raw) => {
      try { return Object.entries(JSON.parse(raw || '{}')).map(([k, v]) => `${k}=${v}`).join(', '); } catch { return ''; }
    };
    const metaInput = el('input', { id: 'filter-metadata', type: 'text', value: labelsOf(filters.metadata), placeholder: 'key=value, key=value' });
    const filterForm = el('form', { id: 'jobs-filter', class: 'toolbar', onsubmit: (e) => {
      e.preventDefault();
      const next = {
        status: statusSel.value,
        workflow_name: wfInput.value.trim(),
        created_after: afterInput.value ? new Date(afterInput.value).toISOString() : '',
        created_before: beforeInput.value ? new Date(beforeInput.value).toISOString() : '',
        metadata: metadataFilter(metaInput.value),
        limit: filters.limit,
      };
      navigate(`#/jobs${query(next)}`);
    } },
    el('label', { class: 'inline' }, 'Status ', statusSel),
    el('label', { class: 'inline' }, 'Workflow ', wfInput),
    el('label', { class: 'inline' }, 'Created after ', afterInput),
    el('label', { class: 'inline' }, 'before ', beforeInput),
    el('label', { class: 'inline' }, 'Metadata ', metaInput),
    el('button', { id: 'filter-apply', type: 'submit' }, 'Apply'),
    el('button', { id: 'filter-clear', type: 'button', class: 'secondary', onclick: () => navigate('#/jobs') }, 'Clear'));

    // --- search by id: checked first so a bad id is reported right here
    const searchInput = el('input', { id: 'job-search', type: 'search', placeholder: 'job id (UUID)', spellcheck: 'false', class: 'mono' });
    const searchErr = el('span', { id: 'job-search-error', class: 'form-error', role: 'alert', hidden: true });
    const searchForm = el('form', { class: 'toolbar', onsubmit: async (e) => {
      e.preventDefault();
      const id = searchInput.value.trim();
      searchErr.hidden = true;
      if (!id) return;
      try {
        await api('GET', `/v1/jobs/${seg(id)}`);
        navigate(`#/jobs/${seg(id)}`);
      } catch (err) {
        if (err.authFailed || !ctx.alive) return;
        searchErr.textContent = err.message;
        searchErr.hidden = false;
      }
    } }, el('label', { class: 'inline' }, 'Find job ', searchInput), el('button', { id: 'job-search-go', type: 'submit' }, 'Go'), searchErr);

    const live = el('input', { id: 'live', type: 'checkbox', checked: true });
    const tbody = el('tbody');
    const table = el('table', { id: 'jobs-table', class: 'data' },
      el('thead', null, el('tr', null, ['Job id', 'Workflow', 'Status', 'Attempt', 'Created', 'Updated'].map((h) => el('th', null, h)))),
      tbody);
    const count = el('span', { id: 'jobs-count', class: 'muted' });
    const loadMore = el('button', { id: 'load-more', type: 'button', class: 'secondary', hidden: true }, 'Load more');

    // --- every job the filters match, at once: counted first (a dry run),
    // then acted on only once the operator confirms that count.
    const filtered = ['status', 'workflow_name', 'created_after', 'created_before', 'metadata'].some((k) => filters[k]);
    const bulkOutcome = el('span', { id: 'bulk-outcome', class: 'muted', role: 'status' });
    const bulkConfirm = el('button', { id: 'bulk-confirm', type: 'button', class: 'danger', hidden: true });
    const bulkBar = el('div', { id: 'bulk', class: 'toolbar', hidden: !(filtered && can('operate')) },
      el('span', { class: 'muted' }, 'All matching: '),
      el('button', { id: 'bulk-retry', type: 'button', class: 'secondary', onclick: () => bulkCount('retry') }, 'Retry all'),
      el('button', { id: 'bulk-cancel', type: 'button', class: 'secondary', onclick: () => bulkCount('cancel') }, 'Cancel all'),
      bulkConfirm, bulkOutcome);
    const bulkBody = (dryRun) => {
      const filter = {};
      for (const k of ['status', 'workflow_name', 'created_after', 'created_before']) if (filters[k]) filter[k] = filters[k];
      if (filters.metadata) {
        try { filter.metadata = JSON.parse(filters.metadata); } catch { /* the API's list says what is wrong */ }
      }
      return { filter, dry_run: dryRun };
    };
    const bulkCount = async (verb) => {
      bulkConfirm.hidden = true;
      try {
        const counted = await api('POST', `/v1/jobs/bulk/${verb}`, { body: bulkBody(true) });
        if (!ctx.alive) return;
        bulkOutcome.textContent = `${counted.matched}${counted.more ? '+' : ''} job(s) match.`;
        bulkConfirm.textContent = `${verb === 'retry' ? 'Retry' : 'Cancel'} ${counted.matched} job(s)`;
        bulkConfirm.onclick = () => bulkAct(verb);
        bulkConfirm.hidden = counted.matched === 0;
      } catch (e) {
        if (!e.authFailed) bulkOutcome.textContent = `Refused: ${e.message}`;
      }
    };
    const bulkAct = async (verb) => {
      bulkConfirm.hidden = true;
      try {
        const done = await api('POST', `/v1/jobs/bulk/${verb}`, { body: bulkBody(false) });
        if (!ctx.alive) return;
        const acted = verb === 'retry' ? 'retried' : 'cancelled';
        bulkOutcome.textContent = `${done.changed} ${acted}, ${done.passed_over} passed over${done.more ? '; more match: again' : ''}.`;
        // The list again from its first page: the jobs acted on may no
        // longer match the filters.
        for (const { tr } of rows.values()) tr.remove();
        rows.clear();
        const first = await fetchPage(undefined, false);
        if (!ctx.alive) return;
        nextCursor = first.next_cursor ?? null;
        appendPage(first.jobs || []);
        renderCount();
      } catch (e) {
        if (!e.authFailed) bulkOutcome.textContent = `Refused: ${e.message}`;
      }
    };

    replaceContent(view, ...page('Jobs',
      el('div', { class: 'page-head' }, el('h1', null, 'Jobs'), el('label', { class: 'inline live' }, live, ' Live refresh')),
      filterForm, bulkBar, searchForm, table, el('div', { class: 'table-foot' }, count, loadMore)));

    const rows = new Map(); // job_id → {tr, job}
    let nextCursor = null;
    let loadFailed = false;

    const renderCount = () => {
      count.textContent = rows.size === 0 ? '' : `${rows.size} job${rows.size === 1 ? '' : 's'} shown`;
      const empty = tbody.querySelector('.empty');
      if (rows.size > 0) {
        if (empty) empty.remove();
      } else {
        const text = loadFailed ? 'Could not load jobs (see the message above).' : 'No jobs match these filters.';
        if (empty) empty.firstChild.textContent = text;
        else tbody.appendChild(el('tr', { class: 'empty' }, el('td', { colspan: 6 }, text)));
      }
      loadMore.hidden = nextCursor === null;
    };

    const appendPage = (jobs) => {
      for (const job of jobs) {
        if (rows.has(job.job_id)) continue;
        const tr = jobRow(job);
        rows.set(job.job_id, { tr, job });
        tbody.appendChild(tr);
      }
    };

    const fetchPage = (cursor, background) =>
      api('GET', `/v1/jobs${query({ ...filters, cursor })}`, { background });

    try {
      const first = await fetchPage(undefined, false);
      if (!ctx.alive) return;
      nextCursor = first.next_cursor ?? null;
      appendPage(first.jobs || []);
    } catch (e) {
      // Keep the filters usable; live refresh keeps trying.
      if (e.authFailed || !ctx.alive) return;
      loadFailed = true;
      report(e);
    }
    renderCount();

    loadMore.addEventListener('click', async () => {
      if (nextCursor === null) return;
      loadMore.disabled = true;
      try {
        const pg = await fetchPage(nextCursor, false);
        if (!ctx.alive) return;
        nextCursor = pg.next_cursor ?? null;
        appendPage(pg.jobs || []);
        renderCount();
      } catch (e) {
        report(e);
      } finally {
        loadMore.disabled = false;
      }
    });

    // Live refresh: merge the first page into the rows in place. Known rows get
    // their changing cells replaced; new rows are inserted by created_at order.
    const merge = (jobs) => {
      // Remember where a visible row sits so we can undo any shift in scroll.
      const anchor = [...rows.values()].map((r) => r.tr).find((tr) => tr.getBoundingClientRect().bottom > 0);
      const before = anchor ? anchor.getBoundingClientRect().top : 0;
      for (const job of jobs.slice().reverse()) {
        const known = rows.get(job.job_id);
        if (known) {
          const old = known.job;
          if (old.status !== job.status || old.attempt !== job.attempt || old.updated_at !== job.updated_at) {
            const fresh = jobRow(job);
            // Swap cells, not the row, so links and focus in the id cell survive.
            for (const cls of ['cell-status', 'cell-attempt', 'cell-updated']) {
              known.tr.querySelector(`.${cls}`).replaceWith(fresh.querySelector(`.${cls}`));
            }
            known.job = job;
            flash(known.tr);
          }
          continue;
        }
        const created = Date.parse(job.created_at);
        const after = [...rows.values()].find((r) => Date.parse(r.job.created_at) < created);
        if (!after && nextCursor !== null) continue; // older than what is loaded: "Load more" will bring it
        const tr = jobRow(job);
        rows.set(job.job_id, { tr, job });
        tbody.insertBefore(tr, after ? after.tr : null);
        // Keep the Map in table order.
        const ordered = [...tbody.querySelectorAll('tr.job-row')].map((r) => [r.dataset.jobId, rows.get(r.dataset.jobId)]);
        rows.clear();
        for (const [k, v] of ordered) rows.set(k, v);
        flash(tr);
      }
      if (anchor && window.scrollY > 0) {
        const delta = anchor.getBoundingClientRect().top - before;
        if (delta) window.scrollBy(0, delta);
      }
      renderCount();
    };

    ctx.every(5000, async () => {
      if (!live.checked) return;
      const pg = await fetchPage(undefined, true);
      if (!ctx.alive) return;
      loadFailed = false;
      if (rows.size > 0) {
        merge(pg.jobs || []);
      } else {
        // Nothing shown yet (empty or failed first load): take the page as is.
        nextCursor = pg.next_cursor ?? null;
        appendPage(pg.jobs || []);
        renderCount();
      }
    });
  }

  function flash(node) {
    node.classList.remove('flash');
    void node.offsetWidth; // restart the CSS animation
    node.classList.add('flash');
  }

  // ---------------------------------------------------------------------------
  // View: Job detail
  // ---------------------------------------------------------------------------

  async function jobView(ctx, view, jobId) {
    const base = `/v1/jobs/${seg(jobId)}`;
    const load = (background) => Promise.all([
      api('GET', base, { background }),
      api('GET', `${base}/events`, { background }),
      // A job another version wrote may not draw: the page shows the rest.
      api('GET', `${base}/graph`, { background: true }).catch(() => null),
      api('GET', `${base}/signals`, { background: true }).catch(() => null),
    ]);
    let [job, evs, graph, sigs] = await load(false);
    if (!ctx.alive) return;

    const field = (label, id) => {
      const dd = el('dd', { id });
      return { dd, nodes: [el('dt', null, label), dd] };
    };
    const f = {
      workflow: field('Workflow', 'job-workflow'),
      metadata: field('Metadata', 'job-metadata'),
      attempt: field('Attempt', 'job-attempt'),
      failed: field('Failed attempts', 'job-failed-attempts'),
      concurrency: field('Concurrency key', 'job-concurrency'),
      deadlines: field('Deadlines', 'job-deadlines'),
      runAfter: field('Run after', 'job-run-after'),
      step: field('Outstanding step', 'job-outstanding-step'),
      lease: field('Lease owner', 'job-lease-owner'),
      leaseUntil: field('Lease until', 'job-lease-until'),
      created: field('Created', 'job-created'),
      updated: field('Updated', 'job-updated'),
      verdict: field('Verdict', 'job-verdict'),
      trace: field('Trace id', 'job-trace-id'),
      parent: field('Started by', 'job-parent'),
      children: field('Children', 'job-children'),
      requests: field('Kafka requests', 'job-kafka-requests'),
      error: field('Error', 'job-error'), // last: it spans the full width
    };
    f.error.dd.classList.add('wide');
    const statusSlot = el('span', { class: 'status-slot' });
    const retryBtn = el('button', { id: 'retry', type: 'button', hidden: true }, 'Retry');
    const cancelBtn = el('button', { id: 'cancel', type: 'button', class: 'danger', hidden: true }, 'Cancel job');
    const answerLink = el('a', { id: 'job-answer', class: 'button answer-link', href: `#/waiting/${seg(jobId)}`, hidden: true }, 'Answer the waiting step');
    const actionResult = el('p', { id: 'action-result', role: 'status', hidden: true });
    const input = jsonBlock('job-input', 'Input', job.input, true);
    const result = jsonBlock('job-result', 'Result', job.result, false);
    const checkpoints = jsonBlock('job-checkpoints', 'Checkpoints', job.checkpoints, false);
    const timelineNote = el('p', { id: 'timeline-note', class: 'muted', hidden: true });
    const timelineBody = el('tbody');
    const liveNote = el('span', { id: 'job-live', class: 'muted' });
    const graphBox = el('div', { id: 'job-graph', class: 'drawing' });
    const signalBody = el('tbody');
    const signalName = el('input', { id: 'signal-name', type: 'text', placeholder: 'name a wait_for step waits for', required: true });
    const signalPayload = el('textarea', { id: 'signal-payload', rows: 3, spellcheck: 'false' }, '{}');
    const signalKey = el('input', { id: 'signal-key', type: 'text', placeholder: 'idempotency key (optional)' });
    const signalSend = el('button', { id: 'signal-send', type: 'submit' }, 'Send signal');
    const signalOutcome = el('p', { id: 'signal-outcome', role: 'status', hidden: true });
    const signalForm = el('form', { id: 'signal-form', class: 'signal-form', novalidate: true, hidden: true },
      el('label', null, 'Name ', signalName),
      el('label', null, 'Payload (JSON) ', signalPayload),
      el('label', null, 'Key ', signalKey),
      el('div', { class: 'actions' }, signalSend));

    replaceContent(view, ...page(`Job ${jobId}`,
      el('p', { class: 'crumbs' }, el('a', { href: '#/jobs' }, '← Jobs')),
      el('div', { class: 'page-head' },
        el('h1', null, 'Job ', el('span', { id: 'job-id', class: 'mono' }, String(job.job_id))), statusSlot, liveNote),
      el('div', { class: 'actions' }, answerLink, retryBtn, cancelBtn),
      actionResult,
      el('dl', { class: 'facts facts-2' }, Object.values(f).map((x) => x.nodes)),
      el('h2', null, 'Steps'),
      graphBox,
      input.node, result.node, checkpoints.node,
      el('h2', null, 'Signals'),
      el('table', { id: 'signals', class: 'data' },
        el('thead', null, el('tr', null, ['#', 'Name', 'Status', 'Received', 'Taken by', 'Payload'].map((h) => el('th', null, h)))),
        signalBody),
      signalForm, signalOutcome,
      el('h2', null, 'Timeline'),
      timelineNote,
      el('table', { id: 'timeline', class: 'data' },
        el('thead', null, el('tr', null, ['#', 'Event', 'Time', 'Attempt', 'Step', 'Verdict / error', 'Publication'].map((h) => el('th', null, h)))),
        timelineBody)));

    const render = () => {
      replaceContent(statusSlot, statusBadge(job.status, 'job-status'));
      const wf = job.workflow_name;
      replaceContent(f.workflow.dd,
        wf ? el('a', { href: `#/workflows/${seg(wf)}` }, String(wf)) : '—',
        job.workflow_version === null || job.workflow_version === undefined ? ' (inline definition)' : ` v${job.workflow_version}`);
      f.attempt.dd.textContent = `${job.attempt ?? '—'} / ${job.max_attempts ?? '—'}`;
      // Each step counts its failed attempts apart (its retry policy).
      const failed = job.failed_attempts && typeof job.failed_attempts === 'object' ? Object.entries(job.failed_attempts) : [];
      const labels = Object.entries(job.metadata || {});
      f.metadata.dd.textContent = labels.length === 0 ? '—' : labels.map(([k, v]) => `${k}=${v}`).join(', ');
      f.failed.dd.textContent = failed.length === 0 ? '—' : failed.map(([step, n]) => `${step}: ${n}`).join(', ');
      // A job of a concurrency key holds a slot from its first step until
      // it ends; one without waits for one (its error says why).
      f.concurrency.dd.textContent = job.concurrency_key
        ? `${job.concurrency_key} (${job.holds_slot ? 'holds a slot' : (['QUEUED', 'RUNNING', 'WAITING'].includes(job.status) ? 'waiting for a slot' : 'ended')})`
        : '—';
      // Timers, the deadlines of waits with a timeout_ms, and the job's own.
      const timers = job.timers && typeof job.timers === 'object' ? Object.entries(job.timers) : [];
      const deadlines = timers.map(([step, at]) => el('div', null, `${step}: `, timeEl(at)));
      if (job.expires_at) deadlines.push(el('div', null, 'the job (execution_timeout_ms): ', timeEl(job.expires_at)));
      replaceContent(f.deadlines.dd, deadlines.length === 0 ? '—' : deadlines);
      replaceContent(f.runAfter.dd, timeEl(job.run_after));
      f.step.dd.textContent = dash(job.outstanding_step);
      f.lease.dd.textContent = dash(job.lease_owner);
      replaceContent(f.leaseUntil.dd, timeEl(job.lease_until));
      f.verdict.dd.textContent = dash(job.verdict);
      f.error.dd.textContent = dash(job.error);
      f.error.dd.classList.toggle('error-text', !!job.error);
      replaceContent(f.parent.dd, job.parent_job_id
        ? [el('a', { class: 'mono', href: `#/jobs/${seg(String(job.parent_job_id))}` }, String(job.parent_job_id)), ` (step ${dash(job.parent_step)})`]
        : '—');
      const kids = Array.isArray(job.children) ? job.children : [];
      replaceContent(f.children.dd, kids.length === 0 ? '—' : kids.map((c) => el('div', { class: 'child-link' },
        el('a', { class: 'mono', href: `#/jobs/${seg(String(c.job_id))}` }, String(c.job_id)),
        ` ${dash(c.step)} → ${dash(c.workflow_name)} `, statusBadge(c.status))));
      // Each Kafka step's latest request: where it went, its correlation
      // id, until when it waits, and whether a reply came.
      const requests = job.step_requests && typeof job.step_requests === 'object' ? Object.entries(job.step_requests) : [];
      replaceContent(f.requests.dd, requests.length === 0 ? '—' : requests.map(([step, r]) => el('div', { class: 'kafka-request' },
        `${step} → ${dash(r && r.topic)} `,
        el('span', { class: 'mono' }, dash(r && r.correlation_id)),
        ' until ', timeEl(r && r.deadline),
        r && r.reply ? (r.reply.error ? ` · refused: ${r.reply.error}` : ' · answered') : ' · waiting')));
      f.trace.dd.textContent = dash(job.trace_id);
      f.trace.dd.classList.add('mono');
      replaceContent(f.created.dd, timeEl(job.created_at));
      replaceContent(f.updated.dd, timeEl(job.updated_at));
      input.set(job.input);
      result.set(job.result);
      checkpoints.set(job.checkpoints);
      if (graph) {
        const { def, states } = graphAsDrawing(graph);
        replaceContent(graphBox, drawWorkflow(def, graphBox.clientWidth, states));
      } else {
        replaceContent(graphBox, el('p', { class: 'muted' }, 'The steps of this job cannot be drawn.'));
      }
      retryBtn.hidden = !(can('operate') && RETRYABLE.has(job.status));
      cancelBtn.hidden = !(can('operate') && CANCELLABLE.has(job.status));
      answerLink.hidden = !(can('answer') && job.status === 'WAITING');
      liveNote.textContent = FINAL.has(job.status) ? '' : 'refreshing every 3 s';

      const kept = (sigs && sigs.signals) || [];
      clear(signalBody);
      for (const sg of kept) {
        signalBody.appendChild(el('tr', { class: 'signal-row', dataset: { seq: sg.seq } },
          el('td', { class: 'num' }, dash(sg.seq)),
          el('td', null, dash(sg.name)),
          el('td', null, dash(sg.status)),
          el('td', null, timeEl(sg.received_at)),
          el('td', null, dash(sg.consumed_by)),
          el('td', { class: 'mono' }, JSON.stringify(sg.payload))));
      }
      if (kept.length === 0) signalBody.appendChild(el('tr', { class: 'empty' }, el('td', { colspan: 6 }, 'No signals.')));
      signalForm.hidden = !(can('answer') && !FINAL.has(job.status));

      const events = (evs && evs.events) || [];
      clear(timelineBody);
      for (const ev of events) {
        timelineBody.appendChild(el('tr', { class: 'event-row', dataset: { sequence: ev.sequence } },
          el('td', { class: 'num' }, dash(ev.sequence)),
          el('td', null, el('span', { class: `event event-${String(ev.event_type).replace(/[^A-Z_]/g, '')}` }, dash(ev.event_type))),
          el('td', null, timeEl(ev.occurred_at)),
          el('td', { class: 'num' }, dash(ev.attempt)),
          el('td', null, dash(ev.step_name)),
          el('td', { class: ev.error ? 'error-text' : null }, ev.error ? String(ev.error) : dash(ev.verdict)),
          el('td', null, el('span', { class: `pub pub-${String(ev.publication).replace(/[^A-Z]/g, '')}` }, dash(ev.publication)))));
      }
      if (events.length === 0) timelineBody.appendChild(el('tr', { class: 'empty' }, el('td', { colspan: 7 }, 'No events.')));
      const firstSeq = events.length ? Number(events[0].sequence) : 1;
      timelineNote.hidden = !(firstSeq > 1);
      timelineNote.textContent = firstSeq > 1
        ? `Events 1–${firstSeq - 1} were published and then deleted by retention; the timeline starts at event ${firstSeq}.`
        : '';
    };
    render();

    const reload = async (background) => {
      [job, evs, graph, sigs] = await load(background);
      if (ctx.alive) render();
    };

    signalForm.addEventListener('submit', async (e) => {
      e.preventDefault();
      const showOutcome = (text, ok) => {
        signalOutcome.className = `outcome ${ok ? 'ok' : 'bad'}`;
        signalOutcome.textContent = text;
        signalOutcome.hidden = false;
      };
      let payload;
      try {
        payload = JSON.parse(signalPayload.value || 'null');
      } catch (err) {
        showOutcome(`The payload is not JSON: ${err.message}`, false);
        return;
      }
      const body = { name: signalName.value.trim(), payload, source: { console: true } };
      if (signalKey.value.trim()) body.idempotency_key = signalKey.value.trim();
      signalSend.disabled = true;
      try {
        const receipt = await api('POST', `${base}/signals`, { body });
        if (!ctx.alive) return;
        showOutcome(receipt.repeat
          ? `Signal ${receipt.seq} was received before under this key.`
          : `Signal ${receipt.seq} received${receipt.woke_job ? '; the job was waiting for it and is queued' : ''}.`, true);
      } catch (err) {
        if (err.authFailed || !ctx.alive) return;
        showOutcome(`Refused: ${err.message}`, false);
      } finally {
        signalSend.disabled = false;
      }
      try {
        await reload(false);
      } catch (err) {
        report(err);
      }
    });

    // Auto-refresh while the job can still change. The timer keeps ticking on a
    // final job (doing nothing) so that a retry revives the refresh by itself.
    ctx.every(3000, async () => {
      if (!FINAL.has(job.status)) await reload(true);
    });

    const act = async (label, path, body) => {
      actionResult.hidden = true;
      retryBtn.disabled = cancelBtn.disabled = true;
      try {
        const updated = await api('POST', path, { body });
        if (!ctx.alive) return;
        actionResult.className = 'outcome ok';
        actionResult.textContent = updated && updated.status === 'RUNNING'
          ? `${label}: asked; the worker running the job ends it at its next heartbeat, or sooner when it parks, sleeps or ends.`
          : `${label}: done, the job is now ${updated && updated.status ? updated.status : 'updated'}.`;
      } catch (e) {
        if (e.authFailed || !ctx.alive) return;
        actionResult.className = 'outcome bad';
        actionResult.textContent = `${label} failed: ${e.message}`;
      } finally {
        retryBtn.disabled = cancelBtn.disabled = false;
      }
      actionResult.hidden = false;
      try {
        await reload(false);
      } catch (e) {
        report(e);
      }
    };

    retryBtn.addEventListener('click', async () => {
      const ok = await confirmAction({ title: 'Retry this job?', message: `Job ${job.job_id} (${job.status}) will be queued again from its last checkpoint.`, yes: 'Retry' });
      if (ok && ctx.alive) await act('Retry', `${base}/retry`, undefined);
    });
    cancelBtn.addEventListener('click', async () => {
      const ok = await confirmAction({ title: 'Cancel this job?', message: `Job ${job.job_id} (${job.status}) will be cancelled. It can be retried later.`, yes: 'Cancel job', askReason: true });
      if (ok && ctx.alive) await act('Cancel', `${base}/cancel`, ok.reason ? { reason: ok.reason } : {});
    });
  }

  // ---------------------------------------------------------------------------
  // View: Waiting for you
  // ---------------------------------------------------------------------------

  async function waitingView(ctx, view) {
    const tbody = el('tbody');
    const note = el('p', { id: 'waiting-note', class: 'muted' });
    replaceContent(view, ...page('Waiting for you',
      el('h1', null, 'Waiting for you'),
      el('p', { class: 'muted' }, 'Jobs paused on a step that a person completes.'),
      el('table', { id: 'waiting-table', class: 'data' },
        el('thead', null, el('tr', null, ['Job id', 'Workflow', 'Outstanding step', 'Waiting since', ''].map((h) => el('th', null, h)))),
        tbody),
      note));

    const load = async (background) => {
      const data = await api('GET', `/v1/jobs${query({ status: 'WAITING', limit: 500 })}`, { background });
      if (!ctx.alive) return;
      const jobs = data.jobs || [];
      clear(tbody);
      for (const job of jobs) {
        const id = String(job.job_id);
        tbody.appendChild(el('tr', { class: 'waiting-row', dataset: { jobId: id } },
          el('td', { class: 'mono' }, el('a', { class: 'job-link', href: `#/jobs/${seg(id)}` }, id)),
          el('td', null, dash(job.workflow_name)),
          el('td', null, dash(job.outstanding_step)),
          el('td', null, timeEl(job.updated_at)),
          el('td', null, can('answer') ? el('a', { class: 'answer-link button', href: `#/waiting/${seg(id)}` }, 'Answer') : '')));
      }
      if (jobs.length === 0) tbody.appendChild(el('tr', { class: 'empty' }, el('td', { colspan: 5 }, 'Nothing is waiting for you.')));
      note.textContent = data.next_cursor ? 'Showing the 500 newest waiting jobs.' : '';
    };
    await load(false);
    ctx.every(5000, () => load(true));
  }

  // A schema the form builder can render field by field.
  const SIMPLE_TYPES = new Set(['string', 'integer', 'number', 'boolean']);
  function isSimpleSchema(schema) {
    if (!isObject(schema) || schema.type !== 'object' || !isObject(schema.properties)) return false;
    const props = Object.values(schema.properties);
    if (props.length === 0) return false;
    return props.every((p) => isObject(p) && (
      (Array.isArray(p.enum) && p.enum.length > 0 && (p.type === undefined || p.type === 'string')) ||
      (SIMPLE_TYPES.has(p.type) && p.enum === undefined)));
  }

  async function answerView(ctx, view, jobId) {
    const job = await api('GET', `/v1/jobs/${seg(jobId)}`);
    if (!ctx.alive) return;
    const jobLink = el('a', { id: 'answer-job-link', href: `#/jobs/${seg(jobId)}` }, 'Open the job');

    const stepName = job.outstanding_step;
    const head = [
      el('p', { class: 'crumbs' }, el('a', { href: '#/waiting' }, '← Waiting for you')),
      el('h1', null, 'Answer step ', el('span', { class: 'mono' }, dash(stepName))),
      el('p', null, 'Job ', el('span', { class: 'mono' }, String(job.job_id)), ' · ', dash(job.workflow_name),
        ' · ', statusBadge(job.status), ' · ', jobLink),
    ];
    if (!stepName) {
      replaceContent(view, ...page('Answer', ...head,
        el('p', { class: 'notice' }, `This job is ${job.status}: no step is waiting for an answer.`)));
      return;
    }
    if (!can('answer')) {
      replaceContent(view, ...page('Answer', ...head,
        el('p', { id: 'answer-not-allowed', class: 'notice' }, 'This token cannot answer steps (it lacks the `answer` scope).')));
      return;
    }

    // Find the output schema of the outstanding step in the job's stored version.
    let schema;
    let schemaNote = '';
    if (job.workflow_version === null || job.workflow_version === undefined) {
      schemaNote = 'The job runs an inline definition: no stored schema, enter the response as JSON.';
    } else {
      try {
        const data = await api('GET', `/v1/workflows/${seg(job.workflow_name)}/versions${query({ before: Number(job.workflow_version) + 1, limit: 1 })}`);
        const def = (data.versions || []).find((v) => v.version === job.workflow_version);
        const step = def && isObject(def.definition) && Array.isArray(def.definition.steps)
          ? def.definition.steps.find((s) => s && s.name === stepName) : undefined;
        if (!def) schemaNote = `Version ${job.workflow_version} of the workflow was not found: enter the response as JSON.`;
        else if (!step) schemaNote = 'The step is not in the stored definition: enter the response as JSON.';
        else schema = step.output_schema;
      } catch (e) {
        if (e.authFailed) throw e;
        schemaNote = `Could not load the workflow definition (${e.message}): enter the response as JSON.`;
      }
    }
    if (!ctx.alive) return;

    const outcome = el('p', { id: 'answer-outcome', role: 'status', hidden: true });
    const submit = el('button', { id: 'answer-submit', type: 'submit' }, 'Send answer');
    const form = el('form', { id: 'answer-form', class: 'answer-form', novalidate: true });
    const builder = isSimpleSchema(schema) ? simpleFields(schema) : jsonEditor(schema);
    appendChildren(form, [builder.nodes, el('div', { class: 'actions' }, submit)]);

    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      outcome.hidden = true;
      const response = builder.collect();
      if (response === undefined) return; // messages are shown next to the fields
      submit.disabled = true;
      const setOutcome = (kind, text, ok) => {
        outcome.dataset.outcome = kind;
        outcome.className = `outcome ${ok ? 'ok' : 'bad'}`;
        outcome.textContent = text;
        outcome.hidden = false;
      };
      try {
        const res = await api('POST', `/v1/jobs/${seg(jobId)}/steps/${seg(stepName)}/complete`, { body: { response } });
        if (!ctx.alive) return;
        if (res && res.outcome === 'ALREADY_DONE') setOutcome('AlreadyDone', 'Already done: this step was answered before.', true);
        else setOutcome('Completed', 'Completed: the job continues.', true);
      } catch (err) {
        if (err.authFailed || !ctx.alive) return;
        const p = err.problem || {};
        if (err.status === 409) {
          const st = p.job_status ? String(p.job_status) : 'not waiting';
          const on = p.outstanding_step ? `, outstanding step "${p.outstanding_step}"` : ', no step outstanding';
          setOutcome('WrongState', `Wrong state: job is ${st}${on}. ${err.message}`, false);
        } else if (err.status === 422) {
          const v = Array.isArray(p.violations) && p.violations.length ? p.violations.map(String).join('; ') : err.message;
          setOutcome('Rejected', `Rejected: ${v}. The job has failed.`, false);
        } else {
          setOutcome('Error', err.message, false);
        }
      } finally {
        submit.disabled = false;
      }
    });

    replaceContent(view, ...page('Answer', ...head,
      job.status !== 'WAITING' ? el('p', { class: 'notice' }, `The job is ${job.status}, not WAITING: the answer will probably be refused.`) : null,
      schemaNote ? el('p', { class: 'notice' }, schemaNote) : null,
      form, outcome));
    const firstInput = form.querySelector('input, select, textarea');
    if (firstInput) firstInput.focus();
  }

  /** One field per property; collect() returns the typed response or undefined. */
  function simpleFields(schema) {
    const required = new Set(Array.isArray(schema.required) ? schema.required.map(String) : []);
    const fields = [];
    const nodes = [];
    for (const [name, prop] of Object.entries(schema.properties)) {
      const id = `field-${name}`;
      const isReq = required.has(name);
      let input;
      if (Array.isArray(prop.enum)) {
        // Option values are indexes: the original enum value keeps its JSON type.
        input = el('select', { id, name },
          el('option', { value: '' }, isReq ? '— choose —' : '— none —'),
          prop.enum.map((v, i) => el('option', { value: String(i), selected: prop.default !== undefined && v === prop.default }, typeof v === 'string' ? v : JSON.stringify(v))));
      } else if (prop.type === 'boolean') {
        input = el('input', { id, name, type: 'checkbox', checked: prop.default === true });
      } else if (prop.type === 'integer' || prop.type === 'number') {
        input = el('input', { id, name, type: 'number', step: prop.type === 'integer' ? '1' : 'any',
          min: prop.minimum, max: prop.maximum, value: typeof prop.default === 'number' ? String(prop.default) : '' });
      } else {
        input = el('input', { id, name, type: 'text', value: typeof prop.default === 'string' ? prop.default : '' });
      }
      if (isReq) input.setAttribute('aria-required', 'true');
      const msg = el('span', { class: 'field-error', id: `error-${name}`, hidden: true });
      const label = el('label', { for: id }, String(prop.title || name), isReq ? el('span', { class: 'required', title: 'required' }, ' *') : null);
      const hint = prop.description ? el('span', { class: 'hint' }, String(prop.description)) : null;
      const typeTag = el('span', { class: 'type-tag' }, Array.isArray(prop.enum) ? 'one of' : String(prop.type));
      nodes.push(el('div', { class: `field${prop.type === 'boolean' ? ' field-check' : ''}` }, label, typeTag, input, hint, msg));
      fields.push({ name, prop, input, msg, isReq });
    }

    const check = ({ prop, input, isReq }) => {
      if (Array.isArray(prop.enum)) {
        if (input.value === '') return isReq ? { error: 'Required: choose a value.' } : {};
        const v = prop.enum[Number(input.value)];
        return v === undefined ? { error: 'Not an allowed value.' } : { value: v };
      }
      if (prop.type === 'boolean') return { value: input.checked };
      const raw = input.value.trim();
      if (prop.type === 'integer' || prop.type === 'number') {
        if (raw === '') return input.validity && input.validity.badInput ? { error: 'Not a number.' } : isReq ? { error: 'Required.' } : {};
        const n = Number(raw);
        if (!Number.isFinite(n)) return { error: 'Not a number.' };
        if (prop.type === 'integer' && !Number.isInteger(n)) return { error: 'Must be a whole number.' };
        if (typeof prop.minimum === 'number' && n < prop.minimum) return { error: `Must be at least ${prop.minimum}.` };
        if (typeof prop.maximum === 'number' && n > prop.maximum) return { error: `Must be at most ${prop.maximum}.` };
        return { value: n };
      }
      const s = input.value;
      if (s === '') return isReq ? { error: 'Required.' } : {};
      if (typeof prop.minLength === 'number' && s.length < prop.minLength) return { error: `At least ${prop.minLength} characters.` };
      if (typeof prop.maxLength === 'number' && s.length > prop.maxLength) return { error: `At most ${prop.maxLength} characters.` };
      return { value: s };
    };

    const collect = () => {
      const out = {};
      let ok = true;
      for (const fld of fields) {
        const r = check(fld);
        fld.msg.textContent = r.error || '';
        fld.msg.hidden = !r.error;
        fld.input.classList.toggle('invalid', !!r.error);
        if (r.error) ok = false;
        else if (r.value !== undefined) out[fld.name] = r.value;
      }
      return ok ? out : undefined;
    };
    return { nodes, collect };
  }

  /** Raw JSON editor with the schema beside it; light checks only (the server validates). */
  function jsonEditor(schema) {
    const area = el('textarea', { id: 'answer-json', name: 'response', rows: 14, spellcheck: 'false', class: 'mono' });
    area.value = '{}';
    const err = el('p', { id: 'answer-json-error', class: 'field-error', role: 'alert', hidden: true });
    const side = schema === undefined || schema === null
      ? el('p', { class: 'muted' }, 'This step declares no output schema.')
      : el('pre', { id: 'answer-schema', class: 'json schema' }, JSON.stringify(schema, null, 2));
    const nodes = [el('div', { class: 'editor' },
      el('div', null, el('label', { for: 'answer-json' }, 'Response (JSON)'), area, err),
      el('div', null, el('div', { class: 'label' }, 'Output schema (read-only)'), side))];

    const collect = () => {
      let value;
      const fail = (m) => {
        err.textContent = m;
        err.hidden = false;
        return undefined;
      };
      try {
        value = JSON.parse(area.value);
      } catch (e) {
        return fail(`Not valid JSON: ${e.message}`);
      }
      const wantsObject = !isObject(schema) || schema.type === 'object' || schema.type === undefined;
      if (wantsObject && !isObject(value)) return fail('The response must be a JSON object.');
      if (isObject(schema) && Array.isArray(schema.required) && isObject(value)) {
        const missing = schema.required.filter((k) => !(String(k) in value));
        if (missing.length) return fail(`Missing required: ${missing.map(String).join(', ')}`);
      }
      err.hidden = true;
      return value;
    };
    return { nodes, collect };
  }

  // ---------------------------------------------------------------------------
  // View: Workflows
  // ---------------------------------------------------------------------------

  async function workflowsView(ctx, view) {
    const data = await api('GET', '/v1/workflows');
    if (!ctx.alive) return;
    const wfs = (data.workflows || []).slice().sort((a, b) => String(a.name).localeCompare(String(b.name)));
    const tbody = el('tbody');
    for (const w of wfs) {
      const steps = w.definition && Array.isArray(w.definition.steps) ? w.definition.steps : [];
      tbody.appendChild(el('tr', { class: 'workflow-row', dataset: { name: String(w.name) } },
        el('td', null, el('a', { class: 'workflow-link', href: `#/workflows/${seg(w.name)}` }, String(w.name))),
        el('td', { class: 'num' }, `v${w.version}`),
        el('td', null, timeEl(w.created_at)),
        el('td', { class: 'num' }, String(steps.length)),
        el('td', null, steps.some((s) => s && s.completion === 'external') ? el('span', { class: 'tag external' }, 'has human step') : '')));
    }
    if (wfs.length === 0) tbody.appendChild(el('tr', { class: 'empty' }, el('td', { colspan: 5 }, 'No workflows stored yet.')));
    replaceContent(view, ...page('Workflows',
      el('h1', null, 'Workflows'),
      el('table', { id: 'workflows-table', class: 'data' },
        el('thead', null, el('tr', null, ['Name', 'Newest version', 'Created', 'Steps', ''].map((h) => el('th', null, h)))),
        tbody)));
  }

  // ---------------------------------------------------------------------------
  // View: Schedules
  // ---------------------------------------------------------------------------

  async function schedulesView(ctx, view) {
    const tbody = el('tbody');
    const outcome = el('p', { id: 'schedule-outcome', role: 'status', hidden: true });
    const workflows = await api('GET', '/v1/workflows').catch(() => ({ workflows: [] }));
    if (!ctx.alive) return;
    const input = (id, placeholder) => el('input', { id, type: 'text', placeholder });
    const f = {
      name: input('schedule-name', 'nightly-report'),
      workflow: el('select', { id: 'schedule-workflow' },
        (workflows.workflows || []).map((w) => el('option', { value: String(w.name) }, String(w.name)))),
      input: el('textarea', { id: 'schedule-input', rows: 2, spellcheck: 'false' }, '{}'),
      cron: input('schedule-cron', '0 9 * * 1-5'),
      zone: input('schedule-time-zone', 'UTC'),
      every: input('schedule-interval', 'or every: 15m'),
      missed: el('select', { id: 'schedule-missed' }, el('option', { value: 'skip' }, 'skip missed ticks'), el('option', { value: 'run_once' }, 'run the latest missed tick once')),
    };
    const form = el('form', { id: 'schedule-form', class: 'signal-form', novalidate: true, hidden: !can('define') },
      el('label', null, 'Name ', f.name), el('label', null, 'Workflow ', f.workflow),
      el('label', null, 'Input (JSON) ', f.input), el('label', null, 'Cron ', f.cron),
      el('label', null, 'Time zone ', f.zone), el('label', null, 'Interval ', f.every),
      el('label', null, 'Missed ticks ', f.missed),
      el('div', { class: 'actions' }, el('button', { id: 'schedule-save', type: 'submit' }, 'Save schedule')));
    replaceContent(view, ...page('Schedules',
      el('h1', null, 'Schedules'),
      el('p', { class: 'muted' }, 'Workflows started on a calendar or an interval; each tick starts one job.'),
      form,
      outcome,
      el('table', { id: 'schedules-table', class: 'data' },
        el('thead', null, el('tr', null, ['Name', 'Workflow', 'When', 'Missed ticks', 'Next run', 'Last job', ''].map((h) => el('th', null, h)))),
        tbody)));

    const act = async (label, method, path) => {
      outcome.hidden = true;
      try {
        await api(method, path);
        if (!ctx.alive) return;
        outcome.className = 'outcome ok';
        outcome.textContent = `${label}: done.`;
      } catch (e) {
        if (e.authFailed || !ctx.alive) return;
        outcome.className = 'outcome bad';
        outcome.textContent = `${label} failed: ${e.message}`;
      }
      outcome.hidden = false;
      await load(false);
    };

    const load = async (background) => {
      const data = await api('GET', '/v1/schedules', { background });
      if (!ctx.alive) return;
      const all = data.schedules || [];
      clear(tbody);
      for (const sc of all) {
        const name = String(sc.name);
        const path = `/v1/schedules/${seg(name)}`;
        const when = sc.cron ? `${sc.cron} (${sc.time_zone})` : `every ${sc.interval}`;
        const buttons = [];
        if (can('operate')) {
          const toggle = el('button', { type: 'button', class: 'schedule-toggle' }, sc.paused ? 'Resume' : 'Pause');
          toggle.addEventListener('click', () => act(sc.paused ? 'Resume' : 'Pause', 'POST', `${path}/${sc.paused ? 'resume' : 'pause'}`));
          buttons.push(toggle);
        }
        if (can('define')) {
          const remove = el('button', { type: 'button', class: 'danger schedule-delete' }, 'Delete');
          remove.addEventListener('click', async () => {
            const ok = await confirmAction({ title: 'Delete this schedule?', message: `Schedule ${name} will start no more jobs. The jobs it started stay.`, yes: 'Delete' });
            if (ok && ctx.alive) await act('Delete', 'DELETE', path);
          });
          buttons.push(remove);
        }
        tbody.appendChild(el('tr', { class: 'schedule-row', dataset: { name } },
          el('td', null, name),
          el('td', null, el('a', { href: `#/workflows/${seg(String(sc.workflow_name))}` }, String(sc.workflow_name))),
          el('td', { class: 'mono' }, when),
          el('td', null, sc.missed === 'run_once' ? 'run once' : 'skip'),
          el('td', null, sc.paused ? el('span', { class: 'muted' }, 'paused') : timeEl(sc.next_run_at)),
          el('td', { class: 'mono' }, sc.last_job_id ? el('a', { href: `#/jobs/${seg(String(sc.last_job_id))}` }, String(sc.last_job_id)) : '—'),
          el('td', null, buttons)));
      }
      if (all.length === 0) tbody.appendChild(el('tr', { class: 'empty' }, el('td', { colspan: 7 }, 'No schedules. Create one with `flotilla schedules put` or PUT /v1/schedules/{name}.')));
    };
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      const say = (text, ok) => {
        outcome.className = `outcome ${ok ? 'ok' : 'bad'}`;
        outcome.textContent = text;
        outcome.hidden = false;
      };
      let parsed;
      try {
        parsed = JSON.parse(f.input.value || '{}');
      } catch (err) {
        say(`The input is not JSON: ${err.message}`, false);
        return;
      }
      const name = f.name.value.trim();
      const body = { workflow_name: f.workflow.value, input: parsed, missed: f.missed.value };
      if (f.cron.value.trim()) {
        body.cron = f.cron.value.trim();
        if (f.zone.value.trim()) body.time_zone = f.zone.value.trim();
      }
      if (f.every.value.trim()) body.interval = f.every.value.trim();
      try {
        const saved = await api('PUT', `/v1/schedules/${seg(name)}`, { body });
        if (!ctx.alive) return;
        say(`Saved ${saved.name}; next run ${localTime(saved.next_run_at)}.`, true);
      } catch (err) {
        if (err.authFailed || !ctx.alive) return;
        say(`Refused: ${err.message}`, false);
        return;
      }
      await load(false);
    });
    await load(false);
    ctx.every(5000, () => load(true));
  }

  async function workflowView(ctx, view, name, params) {
    // The newest page of versions, and the one asked for when it is older.
    const data = await api('GET', `/v1/workflows/${seg(name)}/versions${query({ limit: 100 })}`);
    if (!ctx.alive) return;
    const versions = (data.versions || []).slice();
    const asked = Number(params.get('version'));
    if (Number.isInteger(asked) && asked > 0 && !versions.some((v) => v.version === asked)) {
      const older = await api('GET', `/v1/workflows/${seg(name)}/versions${query({ before: asked + 1, limit: 1 })}`);
      if (!ctx.alive) return;
      versions.push(...(older.versions || []).filter((v) => v.version === asked));
    }
    versions.sort((a, b) => b.version - a.version);
    if (versions.length === 0) {
      replaceContent(view, ...page(name, el('h1', null, String(name)), el('p', null, 'No versions stored.')));
      return;
    }
    const byVersion = new Map(versions.map((v) => [String(v.version), v]));
    const wanted = params.get('version');
    const option = (v, sel) => el('option', { value: String(v.version), selected: sel }, `v${v.version} · ${localTime(v.created_at)}`);

    const versionSel = el('select', { id: 'version' }, versions.map((v, i) => option(v, wanted ? String(v.version) === wanted : i === 0)));
    const drawingBox = el('div', { class: 'drawing' });
    const facts = el('dl', { class: 'facts', id: 'workflow-facts' });
    const defBlock = jsonBlock('workflow-definition', 'Full definition (JSON)', null, false);
    const diffFrom = el('select', { id: 'diff-from' }, versions.map((v, i) => option(v, i === Math.min(1, versions.length - 1))));
    const diffTo = el('select', { id: 'diff-to' }, versions.map((v, i) => option(v, i === 0)));
    const diffSummary = el('span', { id: 'diff-summary', class: 'muted' });
    const diffPre = el('pre', { id: 'diff', class: 'diff' });

    const showVersion = () => {
      const v = byVersion.get(versionSel.value);
      const def = isObject(v.definition) ? v.definition : {};
      replaceContent(drawingBox, drawWorkflow(def, drawingBox.clientWidth));
      replaceContent(facts,
        el('dt', null, 'Version'), el('dd', null, `v${v.version}`),
        el('dt', null, 'Created'), el('dd', null, timeEl(v.created_at)),
        el('dt', null, 'Max attempts'), el('dd', null, dash(def.max_attempts)),
        el('dt', null, 'Deadline'), el('dd', null, def.deadline_ms === undefined ? '—' : `${def.deadline_ms} ms`),
        el('dt', null, 'Output'), el('dd', null, Array.isArray(def.output) ? def.output.map(String).join(', ') : '—'),
        el('dt', null, 'Verdict'), el('dd', { class: 'mono' }, dash(def.verdict)));
      defBlock.set(v.definition);
      // Keep the choice in the URL without triggering a re-render.
      history.replaceState(null, '', `#/workflows/${seg(name)}?version=${seg(v.version)}`);
    };
    const showDiff = () => {
      const a = JSON.stringify(byVersion.get(diffFrom.value).definition, null, 2).split('\n');
      const b = JSON.stringify(byVersion.get(diffTo.value).definition, null, 2).split('\n');
      const ops = lineDiff(a, b);
      clear(diffPre);
      let adds = 0;
      let dels = 0;
      for (const [op, line] of ops) {
        const cls = op === '+' ? 'diff-add' : op === '-' ? 'diff-del' : 'diff-same';
        if (op === '+') adds++;
        if (op === '-') dels++;
        diffPre.appendChild(el('span', { class: `diff-line ${cls}` }, `${op === ' ' ? ' ' : op} ${line}\n`));
      }
      diffSummary.textContent = adds || dels ? `${adds} line${adds === 1 ? '' : 's'} added, ${dels} removed` : 'No differences.';
    };
    versionSel.addEventListener('change', showVersion);
    diffFrom.addEventListener('change', showDiff);
    diffTo.addEventListener('change', showDiff);

    replaceContent(view, ...page(name,
      el('p', { class: 'crumbs' }, el('a', { href: '#/workflows' }, '← Workflows')),
      el('div', { class: 'page-head' }, el('h1', { id: 'workflow-name' }, String(name)), el('label', { class: 'inline' }, 'Version ', versionSel)),
      drawingBox, facts, defBlock.node,
      el('h2', null, 'Compare versions'),
      el('div', { class: 'toolbar' }, el('label', { class: 'inline' }, 'From ', diffFrom), el('label', { class: 'inline' }, 'to ', diffTo), diffSummary),
      diffPre));
    showVersion();
    showDiff();
  }

  /**
   * Line diff by longest common subsequence. Common head and tail are trimmed
   * first; a middle too large for the table falls back to delete-all/add-all.
   */
  function lineDiff(a, b) {
    let start = 0;
    while (start < a.length && start < b.length && a[start] === b[start]) start++;
    let endA = a.length;
    let endB = b.length;
    while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) { endA--; endB--; }
    const out = a.slice(0, start).map((l) => [' ', l]);
    const ma = a.slice(start, endA);
    const mb = b.slice(start, endB);
    const n = ma.length;
    const m = mb.length;
    if (n * m > 4e6) {
      for (const l of ma) out.push(['-', l]);
      for (const l of mb) out.push(['+', l]);
    } else {
      // lcs[i][j] = LCS length of ma[i..] and mb[j..], flattened.
      const w = m + 1;
      const lcs = new Uint32Array((n + 1) * w);
      for (let i = n - 1; i >= 0; i--) {
        for (let j = m - 1; j >= 0; j--) {
          lcs[i * w + j] = ma[i] === mb[j] ? lcs[(i + 1) * w + j + 1] + 1 : Math.max(lcs[(i + 1) * w + j], lcs[i * w + j + 1]);
        }
      }
      let i = 0;
      let j = 0;
      while (i < n && j < m) {
        if (ma[i] === mb[j]) { out.push([' ', ma[i]]); i++; j++; }
        else if (lcs[(i + 1) * w + j] >= lcs[i * w + j + 1]) out.push(['-', ma[i++]]);
        else out.push(['+', mb[j++]]);
      }
      while (i < n) out.push(['-', ma[i++]]);
      while (j < m) out.push(['+', mb[j++]]);
    }
    for (const l of a.slice(endA)) out.push([' ', l]);
    return out;
  }

  /** Truncates for a fixed-width box; the full text goes in a <title> tooltip. */
  const clip = (s, max) => (s.length > max ? `${s.slice(0, max - 1)}…` : s);

  /**
   * What each step needs, by index: its `needs` by name, or (unset) the
   * step before it, as the engine reads a definition.
   */
  function needsOf(steps) {
    const index = new Map(steps.map((step, i) => [String(step.name), i]));
    return steps.map((step, i) => {
      if (!Array.isArray(step.needs)) return i > 0 ? [i - 1] : [];
      return step.needs.map((name) => index.get(String(name))).filter((j) => j !== undefined && j !== i);
    });
  }

  /** A step's kind line: what it calls, or what it waits for. */
  function stepKind(step) {
    if (step.label !== undefined) return step.label;
    if (step.sleep !== undefined) return `sleep ${step.sleep}`;
    if (step.until !== undefined) return 'until an instant';
    const target = step.verb !== undefined || step.path !== undefined
      ? `${step.target ?? '?'} ${step.verb ?? ''} ${step.path ?? `/${step.method ?? ''}`}`.replace(/  +/g, ' ')
      : `${step.target ?? '?'}.${step.method ?? '?'}`;
    if (step.for_each !== undefined) return `${target} for each`;
    if (step.paged) return `${target} paged`;
    return target;
  }

  /**
   * Steps as boxes joined by arrows from what they need. A chain is drawn
   * left to right, wrapping into rows; a graph in columns by depth (a step
   * one column right of its deepest need), each column top to bottom in
   * definition order. `states` (name → {state, note}) colours each step
   * by its state in a job.
   */
  function drawWorkflow(def, avail, states) {
    const steps = Array.isArray(def.steps) ? def.steps.filter(isObject) : [];
    const W = 210;
    const H = 92;
    const GAP = 46;
    const PAD = 16;
    const needs = needsOf(steps);
    const chain = needs.every((n, i) => n.length === (i > 0 ? 1 : 0) && (i === 0 || n[0] === i - 1));
    let pos;
    let width;
    let height;
    if (chain) {
      const perRow = Math.max(1, Math.floor(((avail || 1000) - 2 * PAD - 20 + GAP) / (W + GAP)));
      const rowsN = Math.max(1, Math.ceil(steps.length / perRow));
      const cols = Math.max(1, Math.min(perRow, steps.length));
      width = PAD * 2 + cols * W + (cols - 1) * GAP;
      height = PAD * 2 + rowsN * H + (rowsN - 1) * GAP;
      pos = (i) => ({ x: PAD + (i % perRow) * (W + GAP), y: PAD + Math.floor(i / perRow) * (H + GAP) });
    } else {
      // Depth by relaxation: at most one pass per step (a registered graph has no cycle).
      const depth = steps.map(() => 0);
      for (let pass = 0; pass < steps.length; pass += 1) {
        let moved = false;
        needs.forEach((of, i) => {
          const d = of.reduce((m, j) => Math.max(m, depth[j] + 1), 0);
          if (d !== depth[i]) { depth[i] = d; moved = true; }
        });
        if (!moved) break;
      }
      const rowOf = [];
      const filled = new Map();
      depth.forEach((d, i) => { rowOf[i] = filled.get(d) || 0; filled.set(d, rowOf[i] + 1); });
      const cols = Math.max(1, ...depth.map((d) => d + 1));
      const rowsN = Math.max(1, ...filled.values());
      width = PAD * 2 + cols * W + (cols - 1) * GAP;
      height = PAD * 2 + rowsN * H + (rowsN - 1) * (GAP / 2);
      pos = (i) => ({ x: PAD + depth[i] * (W + GAP), y: PAD + rowOf[i] * (H + GAP / 2) });
    }
    const root = svg('svg', { id: 'workflow-drawing', class: 'workflow-drawing', width, height, viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': `Steps of ${def.name || 'workflow'}` },
      svg('defs', null, svg('marker', { id: 'arrowhead', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 8, markerHeight: 8, orient: 'auto-start-reverse' },
        svg('path', { d: 'M0,0 L10,5 L0,10 z', class: 'arrowhead' }))));
    if (steps.length === 0) {
      root.appendChild(svg('text', { x: PAD, y: PAD + 20, class: 'svg-muted' }, 'This definition has no steps.'));
      return root;
    }
    steps.forEach((step, i) => {
      const { x, y } = pos(i);
      const external = step.completion === 'external';
      const kind = stepKind(step);
      const seen = states && states.get(String(step.name));
      const stateClass = seen ? ` state-${String(seen.state).replace(/[^a-z_]/g, '')}` : '';
      const g = svg('g', { class: `step${external ? ' step-external' : ''}${stateClass}`, 'data-step': String(step.name) },
        svg('title', null, `${step.name}\n${kind}${external ? '\nwaits for a human' : ''}${seen ? `\n${seen.state}${seen.note ? ` (${seen.note})` : ''}` : ''}`),
        svg('rect', { x, y, width: W, height: H, rx: 8, class: 'step-box' }),
        svg('text', { x: x + 12, y: y + 22, class: 'step-index' }, `${i + 1}`),
        svg('text', { x: x + 30, y: y + 22, class: 'step-name' }, clip(String(step.name), 19)),
        svg('text', { x: x + 12, y: y + 44, class: 'step-target' }, clip(kind, 30)));
      let line3 = [];
      if (seen) {
        line3.push(seen.note ? `${seen.state}: ${seen.note}` : String(seen.state));
      } else {
        if (step.when !== undefined) line3.push('when …');
        if (step.timeout_ms !== undefined) line3.push(`timeout ${step.timeout_ms} ms`);
        if (Array.isArray(step.rules) && step.rules.length) line3.push(`${step.rules.length} rule${step.rules.length === 1 ? '' : 's'}`);
        if (step.output_schema) line3.push('schema');
      }
      if (external) g.appendChild(svg('text', { x: x + 12, y: y + 66, class: 'step-external-label' }, 'waits for a human'));
      if (line3.length) g.appendChild(svg('text', { x: x + 12, y: y + (external ? 82 : 68), class: seen ? 'step-state' : 'step-meta' }, clip(line3.join(' · '), 34)));
      root.appendChild(g);
      for (const j of needs[i]) {
        const p = pos(j);
        let d;
        if (!chain) {
          // From the need's right edge to this step's left edge.
          const x1 = p.x + W;
          const y1 = p.y + H / 2;
          const x2 = x - 2;
          const y2 = y + H / 2;
          const bend = Math.max(20, (x2 - x1) / 2);
          d = `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`;
        } else if (p.y === y) {
          d = `M${p.x + W},${y + H / 2} L${x - 2},${y + H / 2}`;
        } else {
          // Wrapping to the next row: down from the previous box, across, down into this one.
          d = `M${p.x + W / 2},${p.y + H} L${p.x + W / 2},${p.y + H + GAP / 2} L${x + W / 2},${p.y + H + GAP / 2} L${x + W / 2},${y - 2}`;
        }
        root.appendChild(svg('path', { d, class: 'arrow', 'marker-end': 'url(#arrowhead)' }));
      }
    });
    return root;
  }

  /** A job's graph (`GET /v1/jobs/{id}/graph`) as a definition and its states. */
  function graphAsDrawing(graph) {
    const nodes = Array.isArray(graph && graph.nodes) ? graph.nodes.filter(isObject) : [];
    const steps = nodes.map((n) => ({
      name: n.name,
      needs: Array.isArray(n.needs) ? n.needs : [],
      label: n.target
        ? `${n.target}${n.call ? ` ${n.call}` : ''}${n.kind === 'call' || n.kind === 'external' ? '' : ` (${n.kind})`}`
        : String(n.kind),
      completion: n.kind === 'external' ? 'external' : undefined,
    }));
    const states = new Map(nodes.map((n) => {
      let note = '';
      if (n.wakes_at) note = `wakes ${localTime(n.wakes_at)}`;
      else if (n.items_done !== undefined && n.items_done !== null) note = `${n.items_done} items done`;
      else if (n.pages !== undefined && n.pages !== null) note = `${n.pages} pages`;
      return [String(n.name), { state: n.state, note }];
    }));
    return { def: { name: 'job', steps }, states };
  }

  // ---------------------------------------------------------------------------
  // View: Fleet
  // ---------------------------------------------------------------------------

  function dataTable(id, headers, rows, emptyText, rowClass) {
    return el('table', { id, class: 'data compact' },
      el('thead', null, el('tr', null, headers.map((h) => el('th', null, h)))),
      el('tbody', null, rows.length
        ? rows.map((cells) => el('tr', { class: rowClass }, cells.map((c) => el('td', null, c))))
        : el('tr', { class: 'empty' }, el('td', { colspan: headers.length }, emptyText))));
  }

  async function fleetView(ctx, view) {
    const slots = {
      workers: el('div'), relays: el('div'), outbox: el('div'), lag: el('div', { id: 'lag' }),
      dead: el('div'), chart: el('div', { class: 'chart-box' }),
    };
    const stamp = el('span', { id: 'fleet-updated', class: 'muted' });
    const card = (title, body) => el('section', { class: 'card' }, el('h2', null, title), body);
    replaceContent(view, ...page('Fleet',
      el('div', { class: 'page-head' }, el('h1', null, 'Fleet'), stamp),
      card('Jobs finished per minute (last hour)', slots.chart),
      card('Workers', slots.workers),
      el('div', { class: 'grid' },
        card('Relays', slots.relays),
        card('Outbox', slots.outbox), card('Consumer lag', slots.lag),
        card('Dead letters', slots.dead))));

    const render = (f) => {
      const workers = Array.isArray(f.workers) ? f.workers : [];
      replaceContent(slots.workers, dataTable('workers', ['Worker', 'Claim loops', 'Jobs held', 'Started', 'Last seen'],
        workers.map((w) => [el('span', { class: 'mono' }, dash(w.worker_id)), dash(w.claim_loops), dash(w.jobs_held), timeEl(w.started_at), timeEl(w.last_seen)]),
        'No live workers.', 'worker-row'));
      const relays = Array.isArray(f.relays) ? f.relays : [];
      replaceContent(slots.relays, dataTable('relays', ['Relay', 'Buckets held', 'Last seen'],
        relays.map((r) => [el('span', { class: 'mono' }, dash(r.relay_id)), dash(r.buckets_held), timeEl(r.last_seen)]),
        'No live relays.', 'relay-row'));
      const ob = isObject(f.outbox) ? f.outbox : {};
      replaceContent(slots.outbox, el('dl', { id: 'outbox', class: 'facts' },
        el('dt', null, 'Pending'), el('dd', { id: 'outbox-pending', class: Number(ob.pending) > 0 ? 'warn' : null }, dash(ob.pending)),
        el('dt', null, 'Failed'), el('dd', { id: 'outbox-failed', class: Number(ob.failed) > 0 ? 'error-text' : null }, dash(ob.failed)),
        el('dt', null, 'Oldest pending'), el('dd', { id: 'outbox-oldest' }, timeEl(ob.oldest_pending_at))));
      const lag = isObject(f.consumer_lag) ? f.consumer_lag : {};
      if (lag.error) {
        replaceContent(slots.lag, el('p', { class: 'error-text lag-error' }, String(lag.error)));
      } else {
        const parts = Array.isArray(lag.partitions) ? lag.partitions : [];
        const total = parts.reduce((s, p) => s + (Number(p.lag) || 0), 0);
        replaceContent(slots.lag,
          el('p', { class: 'muted' }, `group ${dash(lag.group)} · topic ${dash(lag.topic)} · total lag ${total}`),
          dataTable(null, ['Partition', 'Committed', 'High watermark', 'Lag'],
            parts.map((p) => [dash(p.partition), dash(p.committed), dash(p.high_watermark), el('span', { class: Number(p.lag) > 0 ? 'warn' : null }, dash(p.lag))]),
            'No partitions.', 'lag-row'));
      }
      const dl = Array.isArray(f.dead_letters) ? f.dead_letters : [];
      replaceContent(slots.dead, dataTable('dead-letters', ['Reason', 'Count', 'Last'],
        dl.map((d) => [dash(d.reason), dash(d.count), timeEl(d.last_at)]), 'No dead letters.', 'dead-letter-row'));
      replaceContent(slots.chart, finishedChart(Array.isArray(f.finished_per_minute) ? f.finished_per_minute : []));
      stamp.textContent = `updated ${localTime(new Date().toISOString())} · every 5 s`;
    };

    render(await api('GET', '/v1/fleet'));
    ctx.every(5000, async () => {
      const f = await api('GET', '/v1/fleet', { background: true });
      if (ctx.alive) render(f);
    });
  }

  /** Stacked bars per status for the 60 minutes ending now; absent minutes are 0. */
  function finishedChart(points) {
    const MIN = 60000;
    const nowMinute = Math.floor(Date.now() / MIN) * MIN;
    const firstMinute = nowMinute - 59 * MIN;
    const counts = Array.from({ length: 60 }, () => Object.fromEntries(FINISHED.map((s) => [s, 0])));
    for (const p of points) {
      const t = Math.floor(Date.parse(p.minute) / MIN) * MIN;
      const slot = (t - firstMinute) / MIN;
      if (!Number.isInteger(slot) || slot < 0 || slot > 59 || !FINISHED.includes(p.status)) continue;
      counts[slot][p.status] += Number(p.count) || 0;
    }
    const totals = counts.map((c) => FINISHED.reduce((s, k) => s + c[k], 0));
    const max = Math.max(1, ...totals);
    const W = 1160;
    const H = 220;
    const L = 44;
    const R = 160; // room for the legend
    const T = 14;
    const B = 34;
    const plotW = W - L - R;
    const plotH = H - T - B;
    const bw = plotW / 60;
    const root = svg('svg', { id: 'finished-chart', class: 'chart', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'Jobs finished per minute over the last hour, by status' });
    // Axes and labels.
    root.appendChild(svg('line', { x1: L, y1: T + plotH, x2: L + plotW, y2: T + plotH, class: 'axis' }));
    root.appendChild(svg('line', { x1: L, y1: T, x2: L, y2: T + plotH, class: 'axis' }));
    root.appendChild(svg('line', { x1: L, y1: T, x2: L + plotW, y2: T, class: 'gridline' }));
    root.appendChild(svg('text', { x: L - 6, y: T + 4, class: 'axis-label', 'text-anchor': 'end' }, String(max)));
    root.appendChild(svg('text', { x: L - 6, y: T + plotH + 4, class: 'axis-label', 'text-anchor': 'end' }, '0'));
    for (const ago of [60, 45, 30, 15, 0]) {
      const x = L + plotW - (ago / 60) * plotW;
      root.appendChild(svg('text', { x, y: T + plotH + 16, class: 'axis-label', 'text-anchor': ago === 60 ? 'start' : ago === 0 ? 'end' : 'middle' }, ago === 0 ? 'now' : `${ago}`));
    }
    root.appendChild(svg('text', { x: L + plotW / 2, y: H - 3, class: 'axis-title', 'text-anchor': 'middle' }, 'minutes ago'));
    root.appendChild(svg('text', { x: 10, y: T + plotH / 2, class: 'axis-title', 'text-anchor': 'middle', transform: `rotate(-90 10 ${T + plotH / 2})` }, 'jobs / min'));
    // Bars: one stack per minute, statuses bottom-up in a fixed order.
    counts.forEach((c, i) => {
      let y = T + plotH;
      const minute = new Date(firstMinute + i * MIN);
      for (const s of FINISHED) {
        if (!c[s]) continue;
        const h = (c[s] / max) * plotH;
        y -= h;
        root.appendChild(svg('rect', { x: L + i * bw + 1, y, width: Math.max(1, bw - 2), height: h, class: `bar bar-${s}`, 'data-minute': minute.toISOString() },
          svg('title', null, `${localTime(minute.toISOString())}: ${c[s]} ${s}`)));
      }
    });
    // Legend with the hour's totals.
    FINISHED.forEach((s, k) => {
      const y = T + 10 + k * 22;
      const total = counts.reduce((sum, c) => sum + c[s], 0);
      root.appendChild(svg('rect', { x: W - R + 20, y: y - 9, width: 12, height: 12, class: `bar bar-${s}` }));
      root.appendChild(svg('text', { x: W - R + 38, y: y + 1, class: 'legend' }, `${s} ${total}`));
    });
    if (totals.every((t) => t === 0)) {
      root.appendChild(svg('text', { x: L + plotW / 2, y: T + plotH / 2, class: 'svg-muted', 'text-anchor': 'middle' }, 'No jobs finished in the last hour.'));
    }
    return root;
  }

  // ---------------------------------------------------------------------------
  // Start-up
  // ---------------------------------------------------------------------------

  function init() {
    $('sign-in-form').addEventListener('submit', onSignIn);
    $('sign-out').addEventListener('click', () => signOut('Signed out.'));
    $('error-dismiss').addEventListener('click', clearError);
    initConfirm();
    window.addEventListener('hashchange', route);
    setInterval(refreshAges, 15000);
    // A session signed in before the console learnt scopes asks for them once.
    if (getToken() && sessionStorage.getItem(SCOPES_KEY) === null) {
      api('GET', '/v1/me')
        .then((me) => sessionStorage.setItem(SCOPES_KEY, JSON.stringify(isObject(me) && Array.isArray(me.scopes) ? me.scopes : [])))
        .catch(() => {}) // a refused token has signed out already
        .finally(route);
    } else {
      route();
    }
  }

  init();
})();
