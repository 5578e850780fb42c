// Squall's web UI: plain JavaScript, no framework. Every view reads nimbus's API (the paths come
// from the page's "routes" block, made by nimbus from its route table) and is drawn with DOM
// calls: text goes in as text, never as markup. Changes (activate, deactivate, rebalance, kill,
// a reset plan) are POSTs that carry the API token the user types; nimbus checks it.
'use strict';

const ROUTES = JSON.parse(document.getElementById('routes').textContent);
const SVG_NS = 'http://www.w3.org/2000/svg';
const REFRESH_MS = 5000;

// ---- API ---------------------------------------------------------------------------------

function path(name, params) {
  let p = ROUTES[name];
  for (const [key, value] of Object.entries(params || {})) {
    p = p.replace('{' + key + '}', encodeURIComponent(value));
  }
  return p;
}

async function answer(response) {
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
  if (!response.ok) {
    const message = body && body.errorMessage ? body.errorMessage : text;
    throw new Error(response.status + ' ' + response.statusText + ': ' + message);
  }
  return body;
}

async function get(name, params, query) {
  const response = await fetch(path(name, params) + (query || ''), { headers: { Accept: 'application/json' } });
  return answer(response);
}

function token() {
  return document.getElementById('token').value.trim();
}

async function post(name, params, body, tokenValue) {
  const headers = { Accept: 'application/json' };
  if (tokenValue) headers.Authorization = 'Bearer ' + tokenValue;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(path(name, params), {
    method: 'POST',
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return answer(response);
}

// ---- DOM helpers -------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key === 'onclick') node.addEventListener('click', value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function link(href, text, attrs) {
  return el('a', Object.assign({ href }, attrs || {}), text);
}

// A table; each row is a list of cells, a cell a value or {value, class, attrs}.
function table(id, headers, rows, empty) {
  if (!rows.length) return el('p', { class: 'muted', id }, empty || 'None.');
  return el('table', { id },
    el('thead', {}, el('tr', {}, headers.map((h) => el('th', {}, h)))),
    el('tbody', {}, rows.map((row) => el('tr', {}, row.map((cell) => {
      if (cell && typeof cell === 'object' && !(cell instanceof Node) && 'value' in cell) {
        return el('td', Object.assign({ class: cell.class }, cell.attrs || {}), cell.value);
      }
      return el('td', {}, cell);
    })))));
}

function section(title, ...content) {
  return el('section', {}, el('h2', {}, title), content);
}

function keyValues(id, pairs) {
  return el('table', { id, class: 'kv' }, el('tbody', {}, pairs.map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', {}, v)))));
}

function ago(secs) {
  return secs === null || secs === undefined ? '' : secs + ' s ago';
}

function statusBadge(status, id) {
  return el('span', { class: 'badge status-' + String(status).toLowerCase(), id }, status);
}

// ---- the confirmation dialog -------------------------------------------------------------

// Asks before a change: `fields` are extra inputs, `run(values, token)` makes the call.
function confirmAction(title, text, fields, run) {
  const dialog = document.getElementById('confirm');
  document.getElementById('confirm-title').textContent = title;
  document.getElementById('confirm-text').textContent = text;
  const holder = document.getElementById('confirm-fields');
  holder.replaceChildren(...fields.map((f) => el('label', {}, f.label, ' ',
    el('input', { id: 'confirm-' + f.name, type: f.type || 'text', value: f.value, placeholder: f.placeholder }))));
  const tokenInput = document.getElementById('confirm-token');
  tokenInput.value = token();
  const result = document.getElementById('confirm-result');
  result.hidden = true;
  dialog.hidden = false;
  const ok = document.getElementById('confirm-ok');
  const cancel = document.getElementById('confirm-cancel');
  const close = () => { dialog.hidden = true; ok.onclick = null; cancel.onclick = null; };
  cancel.onclick = close;
  ok.onclick = async () => {
    const values = {};
    for (const f of fields) values[f.name] = document.getElementById('confirm-' + f.name).value.trim();
    const given = tokenInput.value.trim();
    if (given) {
      document.getElementById('token').value = given;
      sessionStorage.setItem('squall-token', given);
    }
    ok.disabled = true;
    try {
      await run(values, given);
      close();
      render(false);
    } catch (e) {
      result.textContent = e.message;
      result.hidden = false;
    } finally {
      ok.disabled = false;
    }
  };
}

// ---- views -------------------------------------------------------------------------------

async function clusterView() {
  const [cluster, nimbuses, supervisors, topologies] = await Promise.all([
    get('clusterSummary'), get('nimbusSummary'), get('supervisorSummary'), get('topologySummary'),
  ]);
  return [
    el('h1', {}, 'Cluster'),
    section('Cluster summary', table('cluster-summary',
      ['Version', 'Supervisors', 'Used slots', 'Free slots', 'Total slots', 'Executors', 'Tasks', 'Topologies'],
      [[cluster.stormVersion, cluster.supervisors, cluster.slotsUsed, cluster.slotsFree, cluster.slotsTotal,
        cluster.executorsTotal, cluster.tasksTotal, cluster.topologies]])),
    section('Nimbus summary', table('nimbuses', ['Host', 'Port', 'Status', 'Version', 'Uptime'],
      nimbuses.nimbuses.map((n) => [n.host, n.port, statusBadge(n.status), n.version, n.nimbusUpTime]))),
    section('Topology summary', table('topologies',
      ['Name', 'Id', 'Owner', 'Status', 'Uptime', 'Workers', 'Executors', 'Tasks'],
      topologies.topologies.map((t) => [
        link('#/topology/' + encodeURIComponent(t.id), t.name, { 'data-topology': t.id }), t.id, t.owner,
        statusBadge(t.status), t.uptime, t.workersTotal, t.executorsTotal, t.tasksTotal]),
      'No topology is running.')),
    section('Supervisor summary', table('supervisors', ['Id', 'Host', 'Uptime', 'Slots', 'Used slots', 'Version'],
      supervisors.supervisors.map((s) => [s.id, s.host, s.uptime, s.slotsTotal, s.slotsUsed, s.version]))),
    section('Nimbus configuration', el('details', {}, el('summary', {}, 'Show'), configTable('cluster-configuration', await get('clusterConfiguration')))),
  ];
}

function configTable(id, config) {
  return table(id, ['Key', 'Value'], Object.keys(config).sort().map((k) => [k, JSON.stringify(config[k])]));
}

function errorCell(row) {
  if (!row.lastError) return '';
  return el('span', { class: 'error', title: row.errorHost + ':' + row.errorPort }, row.lastError + ' (' + ago(row.errorLapsedSecs) + ')');
}

let windowChoice = ':all-time';

function windowPicker() {
  const select = el('select', { id: 'window' },
    el('option', { value: ':all-time', selected: windowChoice === ':all-time' }, 'All time'),
    el('option', { value: '600', selected: windowChoice === '600' }, 'Last 10 minutes'));
  select.addEventListener('change', () => { windowChoice = select.value; render(false); });
  return el('label', { class: 'window' }, 'Window ', select);
}

function topologyActions(t) {
  const act = (action, title, text, fields, run) => el('button', {
    type: 'button', 'data-action': action, class: action === 'kill' ? 'danger' : '',
    onclick: () => confirmAction(title, text, fields, run),
  }, title);
  const id = t.id;
  return el('div', { class: 'actions' },
    act('activate', 'Activate', 'Activate topology ' + t.name + '?', [],
      (v, tk) => post('activate', { id }, undefined, tk)),
    act('deactivate', 'Deactivate', 'Deactivate topology ' + t.name + '? Its spouts stop emitting.', [],
      (v, tk) => post('deactivate', { id }, undefined, tk)),
    act('rebalance', 'Rebalance', 'Rebalance topology ' + t.name + '?', [
      { name: 'wait', label: 'Wait (s)', value: '30', type: 'number' },
      { name: 'workers', label: 'Workers', value: '', type: 'number', placeholder: 'unchanged' },
    ], (v, tk) => {
      const options = {};
      if (v.workers) options.numWorkers = Number(v.workers);
      return post('rebalance', { id, wait: v.wait || '0' }, { rebalanceOptions: options }, tk);
    }),
    act('kill', 'Kill', 'Kill topology ' + t.name + '? This removes it from the cluster.', [
      { name: 'wait', label: 'Wait (s)', value: String(t.msgTimeout || 30), type: 'number' },
    ], (v, tk) => post('kill', { id, wait: v.wait || '0' }, undefined, tk)));
}

async function topologyView(id) {
  const query = '?window=' + encodeURIComponent(windowChoice);
  const [t, graph, errors] = await Promise.all([
    get('topology', { id }, query), get('visualization', { id }), get('topologyErrors', { id }),
  ]);
  const componentLink = (c) => link('#/topology/' + encodeURIComponent(id) + '/component/' + encodeURIComponent(c), c, { 'data-component': c });
  return [
    el('h1', {}, 'Topology ', el('span', { id: 'topology-name' }, t.name), ' ', statusBadge(t.status, 'topology-status')),
    topologyActions(t),
    section('Topology summary', keyValues('topology-summary', [
      ['Id', t.id], ['Owner', t.owner], ['Status', t.status], ['Uptime', t.uptime],
      ['Workers', t.workersTotal + ' (requested ' + t.requestedWorkers + ')'], ['Executors', t.executorsTotal],
      ['Tasks', t.tasksTotal], ['Message timeout', t.msgTimeout + ' s'],
      ['Pending', t.pendingTransition ? t.pendingTransition.action + ' in ' + t.pendingTransition.secondsLeft + ' s' : 'none'],
    ])),
    section('Topology stats', table('topology-stats', ['Window', 'Emitted', 'Transferred', 'Complete latency (ms)', 'Acked', 'Failed'],
      t.topologyStats.map((w) => [w.windowPretty, w.emitted, w.transferred, w.completeLatency, w.acked, w.failed]))),
    windowPicker(),
    section('Spouts (' + t.windowHint + ')', table('spouts',
      ['Id', 'Executors', 'Tasks', 'Emitted', 'Transferred', 'Complete latency (ms)', 'Acked', 'Failed', 'Last error'],
      t.spouts.map((s) => [componentLink(s.spoutId), s.executors, s.tasks,
        { value: s.emitted, class: 'emitted', attrs: { 'data-component': s.spoutId } }, s.transferred,
        s.completeLatency, s.acked, s.failed, errorCell(s)]))),
    section('Bolts (' + t.windowHint + ')', table('bolts',
      ['Id', 'Executors', 'Tasks', 'Emitted', 'Transferred', 'Capacity', 'Execute latency (ms)', 'Executed',
        'Process latency (ms)', 'Acked', 'Failed', 'Last error'],
      t.bolts.map((b) => [componentLink(b.boltId), b.executors, b.tasks,
        { value: b.emitted, class: 'emitted', attrs: { 'data-component': b.boltId } }, b.transferred,
        { value: b.capacity, class: Number(b.capacity) >= 0.8 ? 'hot' : '' }, b.executeLatency, b.executed,
        b.processLatency, b.acked, b.failed, errorCell(b)]))),
    section('Topology graph', drawGraph(graph)),
    section('Workers', table('workers', ['Host', 'Port', 'Supervisor', 'Uptime', 'Executors', 'Tasks by component'],
      t.workers.map((w) => [w.host, w.port, w.supervisorId, w.uptime, w.executorsTotal,
        Object.entries(w.componentNumTasks).map(([c, n]) => c + ': ' + n).join(', ')]))),
    section('Errors', table('errors', ['Component', 'Time', 'Host', 'Port', 'Error'],
      errors.errors.map((e) => [e.component, new Date(e.errorTime).toISOString() + ' (' + ago(e.errorLapsedSecs) + ')',
        e.errorHost, e.errorPort, { value: e.error, class: 'error' }]), 'No errors reported.')),
    section('Topology configuration', configTable('topology-configuration', t.configuration)),
  ];
}

// Draws the component graph as SVG: components in columns by their distance from the spouts,
// streams as arrows labelled with stream and grouping.
function drawGraph(graph) {
  const names = Object.keys(graph);
  if (!names.length) return el('p', { class: 'muted' }, 'No components.');
  const depth = {};
  const visit = (name, seen) => {
    if (depth[name] !== undefined) return depth[name];
    if (seen.has(name)) return 0;
    seen.add(name);
    const inputs = graph[name][':inputs'].filter((i) => graph[i[':component']]);
    depth[name] = inputs.length ? 1 + Math.max(...inputs.map((i) => visit(i[':component'], seen))) : 0;
    return depth[name];
  };
  names.forEach((n) => visit(n, new Set()));
  const columns = [];
  names.forEach((n) => { (columns[depth[n]] = columns[depth[n]] || []).push(n); });
  const [W, H, GX, GY] = [150, 46, 90, 30];
  const pos = {};
  columns.forEach((col, x) => col.forEach((n, y) => { pos[n] = { x: 20 + x * (W + GX), y: 20 + y * (H + GY) }; }));
  const width = 40 + columns.length * (W + GX) - GX;
  const height = 40 + Math.max(...columns.map((c) => c.length)) * (H + GY) - GY;
  const svg = (tag, attrs, ...children) => {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  };
  const root = svg('svg', { id: 'graph', width, height, viewBox: '0 0 ' + width + ' ' + height, role: 'img' },
    svg('defs', {}, svg('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 8, markerHeight: 8, orient: 'auto' },
      svg('path', { d: 'M0,0 L10,5 L0,10 z', class: 'arrowhead' }))));
  for (const name of names) {
    for (const input of graph[name][':inputs']) {
      const from = pos[input[':component']];
      const to = pos[name];
      if (!from || !to) continue;
      const [x1, y1, x2, y2] = [from.x + W, from.y + H / 2, to.x, to.y + H / 2];
      root.append(svg('path', { class: 'edge', d: 'M' + x1 + ',' + y1 + ' C' + (x1 + GX / 2) + ',' + y1 + ' ' + (x2 - GX / 2) + ',' + y2 + ' ' + x2 + ',' + y2, 'marker-end': 'url(#arrow)' }));
      root.append(svg('text', { class: 'edge-label', x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 4, 'text-anchor': 'middle' },
        input[':stream'] + ' (' + input[':grouping'] + ')'));
    }
  }
  for (const name of names) {
    const node = graph[name];
    const p = pos[name];
    const busy = node[':type'] === 'bolt' && node[':capacity'] >= 0.8 ? ' hot' : '';
    const detail = node[':type'] === 'spout'
      ? 'latency ' + (node[':latency'] === null ? '-' : node[':latency'].toFixed(3)) + ' ms'
      : 'capacity ' + node[':capacity'].toFixed(3);
    const g = svg('g', { class: 'node ' + node[':type'] + busy, 'data-component': name, tabindex: 0 },
      svg('rect', { x: p.x, y: p.y, width: W, height: H, rx: 8 }),
      svg('text', { x: p.x + W / 2, y: p.y + 19, 'text-anchor': 'middle', class: 'node-name' }, name),
      svg('text', { x: p.x + W / 2, y: p.y + 36, 'text-anchor': 'middle', class: 'node-detail' }, detail));
    g.addEventListener('click', () => { location.hash = node[':link']; });
    root.append(g);
  }
  return root;
}

async function componentView(id, component) {
  const query = '?window=' + encodeURIComponent(windowChoice);
  const c = await get('component', { id, component }, query);
  const spout = c.componentType === 'spout';
  const windows = spout
    ? table('component-stats', ['Window', 'Emitted', 'Transferred', 'Complete latency (ms)', 'Acked', 'Failed'],
      c.spoutSummary.map((w) => [w.windowPretty, w.emitted, w.transferred, w.completeLatency, w.acked, w.failed]))
    : table('component-stats', ['Window', 'Emitted', 'Transferred', 'Executed', 'Execute latency (ms)', 'Process latency (ms)', 'Capacity', 'Acked', 'Failed'],
      c.boltStats.map((w) => [w.windowPretty, w.emitted, w.transferred, w.executed, w.executeLatency, w.processLatency, w.capacity, w.acked, w.failed]));
  const executorHeaders = ['Id', 'Host', 'Port', 'Uptime', 'Emitted', 'Transferred'].concat(spout
    ? ['Complete latency (ms)', 'Acked', 'Failed']
    : ['Capacity', 'Execute latency (ms)', 'Executed', 'Process latency (ms)', 'Acked', 'Failed']);
  const executorRows = c.executorStats.map((e) => [e.id, e.host, e.port, e.uptime, e.emitted, e.transferred].concat(spout
    ? [e.completeLatency, e.acked, e.failed]
    : [e.capacity, e.executeLatency, e.executed, e.processLatency, e.acked, e.failed]));
  return [
    el('h1', {}, (spout ? 'Spout ' : 'Bolt ') + c.id),
    keyValues('component-summary', [
      ['Topology', link('#/topology/' + encodeURIComponent(c.topologyId), c.name)],
      ['Status', c.topologyStatus], ['Executors', c.executors], ['Tasks', c.tasks], ['Owner', c.user]]),
    section((spout ? 'Spout' : 'Bolt') + ' stats', windows),
    windowPicker(),
    section('Executors (' + c.windowHint + ')', table('executors', executorHeaders, executorRows)),
    section('Errors', table('component-errors', ['Time', 'Host', 'Port', 'Error'],
      c.componentErrors.map((e) => [new Date(e.errorTime).toISOString(), e.errorHost, e.errorPort, { value: e.error, class: 'error' }]),
      'No errors reported.')),
  ];
}

async function groupsView() {
  const groups = await get('consumerGroups');
  return [
    el('h1', {}, 'Consumer groups'),
    el('p', { class: 'muted' }, groups.evaluatedAtSecs
      ? 'Judged by nimbus\'s lag evaluator (Burrow\'s rules) at ' + new Date(groups.evaluatedAtSecs * 1000).toISOString() + '.'
      : 'Nimbus\'s lag evaluator has not finished a pass yet.'),
    table('groups', ['Group', 'Status', 'Worst partition', 'Members', 'Partitions', 'Total lag'],
      groups.groups.map((g) => [link('#/group/' + encodeURIComponent(g.group), g.group, { 'data-group': g.group }),
        statusBadge(g.status), statusBadge(g.worstStatus), g.members, g.partitions, g.totalLag]),
      'No consumer group under /consumers.'),
  ];
}

async function groupView(group) {
  const g = await get('consumerGroup', { group });
  return [
    el('h1', {}, 'Consumer group ' + g.group + ' ', statusBadge(g.status, 'group-status')),
    keyValues('group-summary', [['Members', g.members], ['Worst partition', g.worstStatus], ['Total lag', g.totalLag]]),
    section('Partitions', table('partitions', ['Topic', 'Partition', 'Committed offset', 'Log end', 'Lag', 'Owner', 'Lag status'],
      g.partitionsDetail.map((p) => [p.topic, p.partition, p.committedOffset ?? 'unknown', p.logEndOffset ?? 'unknown',
        p.lag ?? 'unknown', p.owner ?? 'none', statusBadge(p.status)]))),
  ];
}

// The reset dry run form: kept across refreshes (built once per visit of the page).
function resetTools(group) {
  const target = el('select', { id: 'reset-to' }, ['earliest', 'latest', 'offset', 'shiftBy'].map((t) => el('option', { value: t }, t)));
  const value = el('input', { id: 'reset-value', type: 'number', placeholder: 'offset or shift' });
  const topic = el('input', { id: 'reset-topic', type: 'text', placeholder: 'all topics' });
  const out = el('div', { id: 'reset-plan' });
  const run = async () => {
    const body = { to: target.value };
    if (value.value !== '' && (target.value === 'offset' || target.value === 'shiftBy')) body.value = Number(value.value);
    if (topic.value.trim()) body.topic = topic.value.trim();
    try {
      const plan = await post('resetPlan', { group }, body, token());
      out.replaceChildren(
        el('p', { class: plan.members ? 'error' : 'muted' }, plan.members
          ? plan.members + ' live member(s): `squall offsets reset --execute` would be refused until the topology is deactivated.'
          : 'Dry run: nothing was written. Apply it with `squall offsets reset --execute` (or `squall replay`).'),
        table('reset-rows', ['Topic', 'Partition', 'Current', 'Target', 'Warning'],
          plan.partitions.map((r) => [r.topic, r.partition, r.currentOffset ?? 'unknown', r.targetOffset, r.warning || ''])));
    } catch (e) {
      out.replaceChildren(el('p', { class: 'error' }, e.message));
    }
  };
  return section('Reset offsets (dry run)', el('div', { class: 'actions' },
    el('label', {}, 'To ', target), el('label', {}, 'Value ', value), el('label', {}, 'Topic ', topic),
    el('button', { type: 'button', id: 'reset-run', onclick: run }, 'Plan')), out);
}

// ---- routing and refresh -----------------------------------------------------------------

function parseHash() {
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  if (parts[0] === 'topology' && parts[1] && parts[2] === 'component' && parts[3]) {
    return { view: () => componentView(parts[1], parts[3]) };
  }
  if (parts[0] === 'topology' && parts[1]) return { view: () => topologyView(parts[1]) };
  if (parts[0] === 'groups') return { view: groupsView };
  if (parts[0] === 'group' && parts[1]) return { view: () => groupView(parts[1]), tools: () => resetTools(parts[1]) };
  return { view: clusterView };
}

let rendering = false;

async function render(navigated) {
  if (rendering) return;
  rendering = true;
  const page = parseHash();
  const error = document.getElementById('error');
  if (navigated) document.getElementById('tools').replaceChildren(...(page.tools ? [page.tools()] : []));
  try {
    const content = await page.view();
    document.getElementById('view').replaceChildren(...content);
    error.hidden = true;
    document.getElementById('refreshed').textContent = 'updated ' + new Date().toLocaleTimeString();
  } catch (e) {
    error.textContent = e.message;
    error.hidden = false;
  } finally {
    rendering = false;
  }
}

document.getElementById('token').value = sessionStorage.getItem('squall-token') || '';
document.getElementById('token').addEventListener('change', (e) => sessionStorage.setItem('squall-token', e.target.value.trim()));
window.addEventListener('hashchange', () => render(true));
setInterval(() => { if (document.getElementById('confirm').hidden) render(false); }, REFRESH_MS);
render(true);
