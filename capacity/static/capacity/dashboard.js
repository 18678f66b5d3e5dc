/*
 * The staff lanes page (/capacity/dashboard/): draws what the staff endpoints answer and changes the config
 * through them, without reloading the page.
 *
 * Every few seconds (the page's data-refresh-seconds) it reads GET /capacity/status/ (lanes, queues, pools
 * per node, the match indexes and how far a build of one is), GET /capacity/config/ (the config in force and the defaults), GET /capacity/decisions/
 * (decisions per minute over the last hour) and GET /capacity/config/history/ (the last changes). A change is
 * one PATCH /capacity/config/ with the note typed beside it, so it is a config version with who and why like
 * any other: setting a lane's limit, pausing it (its limit to 0; api_heavy takes the single-row reserve to 0
 * with it, which can't exceed it) and resuming it (back to what the newest change that paused it took away,
 * read from the history; the default when the history has no such change).
 *
 * Written by hand, in plain DOM calls with no library and no build step: it is a few tables, a bar chart
 * and four buttons over four JSON endpoints, served as one static file (no CDN: the service's hosts may
 * have no way out). A framework would be more code to ship and keep than the page itself.
 */
'use strict';

(function () {
  const page = document.body.dataset;
  const urls = {status: page.statusUrl, config: page.configUrl, history: page.historyUrl,
                decisions: page.decisionsUrl};
  const REFRESH_MS = Math.max(1, Number(page.refreshSeconds) || 3) * 1000;
  const HISTORY_SHOWN = 10;
  const HISTORY_SEARCHED = 200;  // how far back Resume looks for the change that paused a lane
  const DECISIONS = ['admitted', 'shadow-refused', 'refused', 'unavailable', 'coalesced', 'cached'];
  const $ = (id) => document.getElementById(id);

  // --- talking to the API

  class ApiError extends Error {
    constructor(status, body) {
      super(ApiError.describe(status, body));
      this.status = status;
    }

    static describe(status, body) {
      const detail = body && body.detail;
      if (Array.isArray(detail)) return detail.join(' ');
      return detail ? String(detail) : `HTTP ${status}`;
    }
  }

  async function request(url, options = {}) {
    const headers = {Accept: 'application/json', ...(options.headers || {})};
    const response = await fetch(url, {credentials: 'same-origin', ...options, headers});
    const body = await response.json().catch(() => null);
    if (!response.ok) throw new ApiError(response.status, body);
    return body;
  }

  function patchConfig(changes, note) {
    return request(urls.config, {
      method: 'PATCH',
      headers: {'Content-Type': 'application/json', 'X-CSRFToken': page.csrfToken},
      body: JSON.stringify({...changes, note}),
    });
  }

  // --- small helpers

  function el(tag, attributes = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes)) {
      if (name === 'class') node.className = value;
      else if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value);
    }
    node.append(...children.filter((child) => child !== null && child !== undefined)
      .map((child) => (child instanceof Node ? child : String(child))));
    return node;
  }

  function nested(path, value) {
    return path.split('.').reduceRight((inner, key) => ({[key]: inner}), value);
  }

  function at(object, path) {
    return path.split('.').reduce((value, key) => (value == null ? undefined : value[key]), object);
  }

  function seconds(value) {
    if (value === null || value === undefined) return '–';
    return value < 120 ? `${Math.round(value)} s` : `${Math.round(value / 60)} min`;
  }

  function clock(epochSeconds) {
    return new Date(epochSeconds * 1000).toLocaleTimeString([], {hour: '2-digit', minute: '2-digit'});
  }

  function say(text, kind = 'ok') {
    const message = $('message');
    message.textContent = text;
    message.className = kind;
  }

  // --- lanes: rows are made once, so a refresh never clears what someone is typing

  function lanesOf(status, config) {
    const lanes = [
      {id: 'api_heavy', path: 'api_heavy.cluster', state: status.api_heavy, bulk: status.api_heavy.bulk_limit,
       pauses: ['api_heavy.cluster', 'reserve_single_row']},
      {id: 'es2_knn', path: 'es2_knn', state: status.es2_knn, bulk: status.es2_knn.bulk_limit,
       pauses: ['es2_knn']},
    ];
    for (const [tier, state] of Object.entries(status.tiers)) {
      lanes.push({id: `tier:${tier}`, path: `tiers.${tier}`, state, pauses: [`tiers.${tier}`]});
    }
    const hosts = Object.values(status.tasks || {});
    lanes.push({id: 'api_heavy_task', path: 'api_heavy.per_task', per: 'per API host',
                state: {in_flight: hosts.reduce((most, host) => Math.max(most, host.in_flight), 0),
                        limit: config.api_heavy.per_task}});
    return lanes;
  }

  function laneRow(lane) {
    // The handlers read row.lane, which each refresh replaces: the lane as last drawn, not as first seen.
    const limit = el('input', {type: 'number', min: '0', step: '1', class: 'limit-input',
                               'aria-label': `new limit of ${lane.id}`});
    const note = el('input', {type: 'text', class: 'note-input', placeholder: 'note (why)',
                              'aria-label': `note for ${lane.id}`});
    const form = el('form', {class: 'change', onsubmit: (event) => {
      event.preventDefault();
      setLimit(row.lane, limit, note);
    }}, limit, note, el('button', {type: 'submit', class: 'set'}, 'Set'));
    if (lane.pauses) {
      form.append(el('button', {type: 'button', class: 'pause', onclick: () => pauseOrResume(row.lane, note)},
                     'Pause'));
    }
    const row = el('tr', {'data-lane': lane.id},
                   el('th', {scope: 'row'}, lane.id, lane.per ? el('small', {}, ` ${lane.per}`) : null),
                   el('td', {class: 'in-flight'}), el('td', {class: 'limit'}),
                   el('td', {class: 'meter-cell'}, el('meter', {min: '0', max: '1', value: '0'})),
                   el('td', {}, form));
    return row;
  }

  function drawLanes(status, config) {
    const body = $('lanes').tBodies[0];
    for (const lane of lanesOf(status, config)) {
      let row = body.querySelector(`tr[data-lane="${CSS.escape(lane.id)}"]`);
      if (!row) body.append(row = laneRow(lane));
      row.lane = lane;
      const {in_flight: inFlight, limit} = lane.state;
      const paused = lane.pauses && limit === 0;
      row.classList.toggle('paused', Boolean(paused));
      row.querySelector('.in-flight').textContent = inFlight;
      row.querySelector('.limit').textContent = paused ? '0 (paused)'
        : lane.bulk !== undefined ? `${limit} (bulk ${lane.bulk})` : limit;
      const meter = row.querySelector('meter');
      meter.max = Math.max(limit, 1);
      meter.value = Math.min(inFlight, meter.max);
      meter.title = `${inFlight} of ${limit}`;
      const pause = row.querySelector('.pause');
      if (pause) pause.textContent = paused ? 'Resume' : 'Pause';
      row.querySelector('.limit-input').placeholder = limit;
    }
    const users = Object.entries(status.users || {})
      .map(([user, state]) => `user ${user}: ${state.in_flight}`);
    const hosts = Object.entries(status.tasks || {}).map(([host, state]) => `${host}: ${state.in_flight}`);
    $('lanes-extra').textContent = [
      `waiting requests per host (limit ${config.api_heavy.per_task}): ${hosts.join(', ') || 'none'}`,
      `users with calls in flight: ${users.join(', ') || 'none'}`,
      `leases expired without a release: ${status.leases_expired_total ?? '–'}`,
    ].join(' · ');
  }

  async function change(changes, note, done) {
    try {
      const answer = await patchConfig(changes, note);
      const changed = Object.entries(answer.changes || {})
        .map(([path, [from, to]]) => `${path} ${from} → ${to}`);
      say(changed.length ? `Saved version ${answer.version}: ${changed.join(', ')}.` : 'Nothing changed.');
      if (done) done();
    } catch (error) {
      say(`Not saved: ${error.message}`, 'error');
    }
    refresh();
  }

  function setLimit(lane, limitInput, noteInput) {
    const value = limitInput.value.trim();
    if (!/^\d+$/.test(value)) {
      say(`Type a whole number for ${lane.id}.`, 'error');
      return;
    }
    change(nested(lane.path, Number(value)), noteInput.value.trim(), () => {
      limitInput.value = '';
      noteInput.value = '';
    });
  }

  async function pauseOrResume(lane, noteInput) {
    const note = noteInput.value.trim();
    const clear = () => { noteInput.value = ''; };
    if (lane.state.limit !== 0) {
      const changes = lane.pauses.reduce((all, path) => merge(all, nested(path, 0)), {});
      change(changes, note || `paused ${lane.id} from the lanes page`, clear);
      return;
    }
    try {
      const [history, config] = await Promise.all([
        request(`${urls.history}?limit=${HISTORY_SEARCHED}`), request(urls.config)]);
      const pausing = history.find((version) => {
        const step = (version.changes || {})[lane.path];
        return step && step[1] === 0 && step[0] > 0;
      });
      const changes = {};
      for (const path of lane.pauses) {
        const step = pausing && pausing.changes[path];
        if (pausing && !(step && step[1] === 0)) continue;  // that pause left this setting as it was
        merge(changes, nested(path, pausing ? step[0] : at(config.defaults, path)));
      }
      change(changes, note || `resumed ${lane.id} from the lanes page`, clear);
    } catch (error) {
      say(`Could not resume ${lane.id}: ${error.message}`, 'error');
    }
  }

  function merge(target, source) {
    for (const [key, value] of Object.entries(source)) {
      target[key] = value && typeof value === 'object' ? merge(target[key] || {}, value) : value;
    }
    return target;
  }

  // --- queues and their pools per node

  function drawQueues(queues) {
    const rows = [];
    for (const [name, queue] of Object.entries(queues || {})) {
      rows.push(el('tr', {'data-queue': name, class: 'queue'},
                   el('th', {scope: 'row', title: queue.carries || ''}, name),
                   el('td', {class: 'depth'}, queue.depth ?? (queue.broker || '–')),
                   el('td', {class: 'oldest'}, seconds(queue.oldest_waiting_seconds)),
                   el('td', {class: 'pool'}, queue.pool),
                   el('td', {class: 'configured'}, `${queue.configured_pool} = ${queue.sized_by}`),
                   el('td', {class: 'consumers'}, queue.consumers),
                   el('td', {class: 'drift'}, queue.drift ?? '–')));
      for (const [node, pool] of Object.entries(queue.workers || {})) {
        rows.push(el('tr', {'data-queue': name, 'data-node': node, class: 'node'},
                     el('td', {class: 'node-name'}, node),
                     el('td', {}, ''), el('td', {}, `seen ${seconds(pool.seen_seconds_ago)} ago`),
                     el('td', {class: 'pool'}, pool.processes),
                     el('td', {class: 'share'}, pool.share),
                     el('td', {class: 'consuming'}, pool.consuming ? 'consuming' : 'not consuming'),
                     el('td', {class: 'drift'}, pool.drift)));
      }
    }
    $('queues').tBodies[0].replaceChildren(...rows);
  }

  // --- match indexes: ready, or how far their build is (a first start builds the semantic one after its banner)

  function progressOf(part) {
    if (part.state !== 'building') return part.error || '';
    if (!part.total) return part.step || '';
    return `${part.step}: ${part.done} of ${part.total} (${Math.floor((100 * part.done) / part.total)} %)`;
  }

  function drawIndexes(indexes) {
    const rows = [];
    if (indexes && indexes.error) {
      rows.push(el('tr', {}, el('td', {colspan: '5', class: 'error'}, indexes.error)));
    }
    for (const [source, parts] of Object.entries((indexes && !indexes.error && indexes) || {})) {
      for (const [kind, part] of Object.entries(parts)) {
        rows.push(el('tr', {'data-source': source, 'data-index': kind, class: `index ${part.state}`},
                     el('th', {scope: 'row'}, source),
                     el('td', {}, part.embedder ? `${kind} (${part.embedder})` : kind),
                     el('td', {class: 'state'}, part.state),
                     el('td', {class: 'progress'}, progressOf(part)),
                     el('td', {class: 'elapsed'}, seconds(part.elapsed_seconds))));
      }
    }
    $('indexes').tBodies[0].replaceChildren(...rows);
  }

  // --- decisions per minute: a stacked bar a minute, drawn in SVG

  const SVG = 'http://www.w3.org/2000/svg';

  function svg(tag, attributes = {}) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
    return node;
  }

  function drawDecisions(answer) {
    const chart = $('chart');
    const series = answer.series || [];
    if (answer.redis !== 'ok') {
      chart.replaceChildren(el('p', {class: 'error'}, `No series: ${answer.redis}`));
      return;
    }
    const width = 720, height = 140, top = 10, bottom = 18, left = 34;
    const bar = (width - left) / Math.max(series.length, 1);
    const totals = series.map((minute) => Object.values(minute.decisions).reduce((a, b) => a + b, 0));
    const most = Math.max(1, ...totals);
    const plot = svg('svg', {viewBox: `0 0 ${width} ${height}`, class: 'decisions'});
    plot.append(svg('line', {x1: left, x2: width, y1: height - bottom, y2: height - bottom, class: 'axis'}));
    const label = (x, y, text, anchor = 'start') => {
      const node = svg('text', {x, y, 'text-anchor': anchor});
      node.textContent = text;
      plot.append(node);
    };
    label(left - 4, top + 8, most, 'end');
    label(left - 4, height - bottom, 0, 'end');
    if (series.length) {
      label(left, height - 4, clock(series[0].minute));
      label(width, height - 4, clock(series[series.length - 1].minute), 'end');
    }
    const sums = {};
    series.forEach((minute, index) => {
      let y = height - bottom;
      const group = svg('g', {'data-minute': minute.minute});
      const title = svg('title');
      title.textContent = `${clock(minute.minute)}: ` + (Object.entries(minute.decisions)
        .map(([decision, count]) => `${decision} ${count}`).join(', ') || 'no calls');
      group.append(title);
      const others = Object.keys(minute.decisions).filter((decision) => !DECISIONS.includes(decision));
      for (const decision of DECISIONS.concat(others)) {
        const count = minute.decisions[decision] || 0;
        if (!count) continue;
        sums[decision] = (sums[decision] || 0) + count;
        const tall = (count / most) * (height - top - bottom);
        y -= tall;
        group.append(svg('rect', {x: left + index * bar + 1, y, width: Math.max(bar - 2, 1), height: tall,
                                  class: `d-${decision}`}));
      }
      plot.append(group);
    });
    chart.replaceChildren(plot);
    $('legend').replaceChildren(...Object.entries(sums).map(([decision, count]) =>
      el('li', {class: `d-${decision}`, 'data-decision': decision}, `${decision} ${count}`)));
    if (!Object.keys(sums).length) {
      $('legend').replaceChildren(el('li', {}, 'no gated calls in the last hour'));
    }
  }

  // --- config changes

  function drawHistory(history) {
    $('history').tBodies[0].replaceChildren(...history.slice(0, HISTORY_SHOWN).map((version) => el('tr',
      {'data-version': version.version},
      el('td', {}, `v${version.version}`),
      el('td', {}, new Date(version.created_at).toLocaleString()),
      el('td', {class: 'who'}, version.created_by || '–'),
      el('td', {}, version.source),
      el('td', {class: 'changes'}, Object.entries(version.changes || {})
        .map(([path, [from, to]]) => `${path} ${from ?? '–'} → ${to ?? '–'}`).join(', ')),
      el('td', {class: 'note'}, version.note || ''))));
  }

  // --- the refresh loop

  let timer = null;
  let running = false;
  let again = false;  // asked for while a refresh ran (a change was saved): run one more at once
  let failed = false;  // the message says the last refresh failed: the next one that works clears it

  async function refresh() {
    clearTimeout(timer);
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      const [status, config, decisions, history] = await Promise.all([
        request(urls.status), request(urls.config), request(urls.decisions),
        request(`${urls.history}?limit=${HISTORY_SHOWN}`)]);
      $('mode').textContent = status.mode;
      $('enforce-for').textContent = status.enforce_for;
      $('redis').textContent = status.redis;
      $('redis').className = status.redis === 'ok' ? 'ok' : 'error';
      $('version').textContent = config.version
        ? `v${config.version} by ${config.created_by || config.source}` : 'defaults';
      if (status.redis === 'ok') drawLanes(status, config.config);
      drawQueues(status.queues);
      drawIndexes(status.indexes);
      drawDecisions(decisions);
      drawHistory(history);
      $('updated').textContent = new Date().toLocaleTimeString();
      document.body.dataset.refreshed = String(Date.now());
      if (failed) say('');
      failed = false;
    } catch (error) {
      failed = true;
      if (error.status === 401 || error.status === 403) {
        say('Your session has ended or is not staff: log in again.', 'error');
        const link = el('a', {href: page.loginUrl}, 'Log in');
        $('message').append(' ', link);
      } else {
        say(`Could not refresh: ${error.message}`, 'error');
      }
    } finally {
      running = false;
      timer = setTimeout(refresh, again ? 0 : REFRESH_MS);
      again = false;
    }
  }

  refresh();
}());
