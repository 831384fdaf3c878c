// The board page: the groups and runs tables (sorted by a click on a header,
// filtered by the filter box), the chart (uPlot) of the ticked runs and
// groups, the hyperparameter views (hparams.js), a run's figures, and the experiments' reports. Served, it polls
// api/board and fetches only the records it lacks (api/records?since=N);
// exported (attn board --static), it draws from the data embedded in the page.
//
// URL parameters set where it starts: runs=ID,ID or all, groups=ID,ID or all,
// metric=, x=step|wall_time, yscale=auto|log|linear, yall=1 (every y value, not the bulk), smooth=BETA, filter=,
// group_by=KEY (a curve per value of a setting over the runs shown), open=RUN (its figures; the run's name or id),
// panels=METRIC,METRIC (a grid of panels below the chart, one metric each), poll=SECONDS (default 2),
// color_by=KEY|none (the page's colours), and the hyperparameter views': hp_metric=, hp_value=final|best,
// hp_x=KEY (the scatter's x). With nothing ticked (and no group by) the chart draws the runs shown, or the
// DEFAULT_RUNS most recently updated of them, and says so.
//
// For tests, #chart carries data-series (curves drawn), data-bands (± std
// bands), data-points (finite points of the curves), data-draws (draws so far), data-ylow/yhigh
// (the y range chosen), data-crosses (diverged runs' × drawn) and data-references (reference lines);
// each table row drawn data-color (its colour in every view); #hp-scatter carries data-points,
// data-crosses, data-clamped (points held to the edge), data-x/xkind/xlog/ylog/categories (its axes),
// #hp-parallel data-axes, data-lines, data-crosses and data-keys (its axes' keys, the metric last),
// each data-hover (the run under the pointer); <body> carries data-busy (refreshes in flight: records fetched, then
// every view re-drawn, which moves what lies below the chart), so a script clicks only once the layout is still.
"use strict";
(function (board) {
  const {PALETTE, DASHES} = board.views;  // the colours every view shares (hparams.js)
  const naturalCompare = board.naturalCompare;
  const X_LABELS = {step: "step", wall_time: "wall time (s)"};
  const DEFAULT_POLL_SECONDS = 2;
  const DEFAULT_RUNS = 20;  // nothing ticked: the chart draws at most this many runs, the most recently updated
  const REFERENCE_STYLE = {  // the reference lines' look, as the run figures draw them (attn.train.figures); levels from the runs
    chance: {label: "chance", stroke: "#666666", dash: [2, 3]},
    no_retrieval: {label: "no retrieval", stroke: "#8c8c8c", dash: [7, 4]},
  };
  const params = new URLSearchParams(location.search);
  const embedded = JSON.parse(document.getElementById("board-data").textContent);
  const $ = (id) => document.getElementById(id);

  const state = {
    data: null,  // the snapshot (api/board, or the export's)
    dataText: "",
    runsById: new Map(),
    records: new Map(),  // run id -> its records, as far as fetched
    selectedRuns: new Set(),
    selectedGroups: new Set(),
    sorts: {runs: {key: null, dir: 1}, groups: {key: null, dir: 1}},
    filter: {tests: [], errors: []},
    openRun: params.get("open"),
    openExperiments: new Set(),
    rendered: new Map(),  // element id -> the JSON it was last rendered from
    plot: null,  // the main chart's uPlot
    plotShape: "",
    panels: [],  // the grid's panels beyond the main chart
    draws: 0,
  };

  // ------------------------------------------------------------------ helpers
  function element(tag, attributes = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes)) {
      if (value === false || value == null) continue;
      if (name === "text") node.textContent = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : value);
    }
    node.append(...children.filter((c) => c != null));
    return node;
  }

  // Python's format(value, ".{digits}g")
  function formatG(value, digits) {
    if (!board.isFiniteNumber(value)) return "—";
    const exponent = Number(value.toExponential(digits - 1).split("e")[1]);
    if (exponent < -4 || exponent >= digits) {
      const [mantissa, power] = value.toExponential(digits - 1).split("e");
      const sign = power.startsWith("-") ? "-" : "+";
      return mantissa.replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "") + "e" + sign + power.replace(/^[-+]/, "").padStart(2, "0");
    }
    const fixed = value.toFixed(Math.max(0, digits - 1 - exponent));
    return fixed.includes(".") ? fixed.replace(/0+$/, "").replace(/\.$/, "") : fixed;
  }

  function formatFixed(value, decimals) {
    return board.isFiniteNumber(value) ? value.toFixed(decimals) : "—";
  }

  async function getJSON(url, options = {}) {
    const response = await fetch(url, {cache: "no-cache", ...options});
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
    return body;
  }

  function renderOnChange(id, value, render) {
    const key = JSON.stringify(value);
    if (state.rendered.get(id) === key) return;
    state.rendered.set(id, key);
    render();
  }

  function setLive(text, bad = false) {
    const live = $("live");
    live.textContent = text;
    live.classList.toggle("bad", bad);
  }

  // ------------------------------------------------------------------ data
  function takeData(data) {
    state.data = data;
    state.runsById = new Map(data.runs.map((run) => [run.id, run]));
    const groups = new Map(data.groups.map((group) => [group.id, group]));
    const experiments = new Map(data.experiments.map((e) => [e.id, e]));
    for (const run of data.runs) {
      run.group_label = groups.get(run.group)?.label;
      run.experiment_name = experiments.get(run.experiment)?.name;
    }
    state.keys = [...new Set(data.runs.flatMap((run) => Object.keys(run.settings)))];
  }

  // the runs whose records the page needs: the ticked ones and those of ticked groups (even where the filter
  // hides them: it may let them back in), and every run the curves draw
  function wantedRuns() {
    const wanted = new Set(state.selectedRuns);
    for (const group of state.data.groups) {
      if (state.selectedGroups.has(group.id)) group.runs.forEach((id) => wanted.add(id));
    }
    curveEntries().forEach((entry) => entry.ids.forEach((id) => wanted.add(id)));
    return [...wanted].filter((id) => state.runsById.has(id));
  }

  // fetch the records of the runs drawn that the page lacks; true if any arrived. One fetch at a
  // time (a tick during a poll waits for it), so no record is appended twice.
  let fetching = Promise.resolve();
  function fetchRecords() {
    const next = fetching.then(fetchMissingRecords);
    fetching = next.catch(() => {});
    return next;
  }

  async function fetchMissingRecords() {
    if (embedded) return false;
    let changed = false;
    for (const id of wantedRuns()) {
      const have = state.records.get(id);
      if (have && have.length === state.runsById.get(id).n_records) continue;
      const since = have ? have.length : 0;
      let url = `api/records?run=${encodeURIComponent(id)}&since=${since}`;
      if (since) url += `&last=${have[since - 1].step}`;
      const answer = await getJSON(url);
      if (answer.reset || !have) state.records.set(id, answer.records);
      else if (answer.records.length) state.records.set(id, have.concat(answer.records));
      changed = changed || answer.reset || !have || answer.records.length > 0;
    }
    return changed;
  }

  // ------------------------------------------------------------------ tables
  function compareValues(a, b) {
    const missingA = a == null || (typeof a === "number" && !Number.isFinite(a));
    const missingB = b == null || (typeof b === "number" && !Number.isFinite(b));
    if (missingA || missingB) return missingA - missingB;
    if (typeof a === "number" && typeof b === "number") return a - b;
    return naturalCompare(String(a), String(b));
  }

  function sortRows(rows, columns, sort) {
    const column = columns.find((c) => c.key === sort.key);
    if (!column) return rows;
    return rows.slice().sort((a, b) => {
      const va = column.value(a), vb = column.value(b);
      const missing = (v) => v == null || (typeof v === "number" && !Number.isFinite(v));
      if (missing(va) || missing(vb)) return missing(va) - missing(vb);  // missing values last either way
      return sort.dir * compareValues(va, vb);
    });
  }

  // columns: [{key, label, value: row => sort value, cell: row => node or text, title}]
  function renderTable(table, name, columns, rows, selected, rowId) {
    const sort = state.sorts[name];
    const sorted = sortRows(rows, columns, sort);
    const allBox = element("input", {type: "checkbox", title: "tick every row shown",
                                     checked: sorted.length > 0 && sorted.every((row) => selected.has(rowId(row)))});
    allBox.addEventListener("change", () => {
      sorted.forEach((row) => (allBox.checked ? selected.add(rowId(row)) : selected.delete(rowId(row))));
      renderTables();
      refreshChart();
    });
    const header = element("tr", {}, element("th", {}, allBox), ...columns.map((column) => {
      const mark = sort.key === column.key ? (sort.dir > 0 ? " ▲" : " ▼") : "";
      return element("th", {"data-key": column.key, title: column.title || `sort by ${column.label}`,
                            "aria-sort": sort.key === column.key ? (sort.dir > 0 ? "ascending" : "descending") : false,
                            onclick: () => {
                              state.sorts[name] = {key: column.key, dir: sort.key === column.key ? -sort.dir : 1};
                              renderTables();
                            }}, column.label + mark);
    }));
    const body = sorted.map((row) => {
      const id = rowId(row);
      const box = element("input", {type: "checkbox", checked: selected.has(id), "aria-label": `draw ${id}`});
      box.addEventListener("change", () => {
        box.checked ? selected.add(id) : selected.delete(id);
        refreshChart();
      });
      return element("tr", {"data-id": id}, element("td", {}, box),
                     ...columns.map((column) => element("td", {class: column.className}, column.cell(row))));
    });
    table.replaceChildren(element("thead", {}, header), element("tbody", {}, ...body));
    table.dataset.sort = sort.key ? `${sort.key}:${sort.dir > 0 ? "asc" : "desc"}` : "";
    table.dataset.rows = String(sorted.length);
  }

  function metricColumn(key, label, format) {
    return {key, label, value: (run) => run[key], cell: (run) => format(run[key]), className: "number"};
  }

  function runColumns() {
    const threshold = Math.round(state.data.threshold * 100);
    return [
      {key: "name", label: "name", value: (run) => run.name,
       cell: (run) => element("span", {}, element("span", {class: "swatch row-swatch"}),
                              element("a", {href: "#", class: "run-link", title: run.path,
                                            onclick: (event) => { event.preventDefault(); openRun(run.id); }}, run.name))},
      {key: "status", label: "status", value: (run) => run.status,
       cell: (run) => element("span", {class: `status status-${run.status}`, title: run.reason || false}, run.status)},
      {key: "outcome", label: "outcome", title: "what became of the run (attn.outcomes; filter: outcome=stalled) (sort)",
       value: (run) => run.outcome,
       cell: (run) => (run.outcome ? element("span", {class: `outcome outcome-${run.outcome.replace(/\W+/g, "-")}`},
                                             run.outcome_said || run.outcome) : "—")},
      {key: "step", label: "step", value: (run) => run.step, className: "number",
       cell: (run) => (run.step == null ? "—" : `${run.step}/${run.steps}`)},
      ...state.data.columns.map((column) => ({
        key: `setting:${column.key}`, label: column.name, title: `${column.key} (sort)`,
        value: (run) => run.values[column.key], cell: (run) => run.settings[column.key] ?? "—",
      })),
      metricColumn("final_eval_loss", "eval_loss", (v) => formatG(v, 4)),
      metricColumn("best_eval_loss", "best eval_loss", (v) => formatG(v, 4)),
      metricColumn("final_eval_accuracy", "eval_acc", (v) => formatFixed(v, 3)),
      metricColumn("best_eval_accuracy", "best eval_acc", (v) => formatFixed(v, 3)),
      metricColumn("steps_to_99", `steps to ${threshold}%`, (v) => (v == null ? "never" : String(v))),
    ];
  }

  function groupColumns() {
    const statuses = (group) => Object.entries(group.statuses).map(([s, n]) => `${s} ${n}`).join(", ");
    return [
      {key: "label", label: "group", value: (group) => group.label,
       cell: (group) => element("span", {}, element("span", {class: "swatch row-swatch"}), group.label)},
      {key: "n", label: "runs", value: (group) => group.runs.length, cell: (group) => String(group.runs.length),
       className: "number"},
      {key: "status", label: "status", value: statuses, cell: statuses},
    ];
  }

  function shownRuns() {
    return state.data.runs.filter((run) => state.filter.tests.every((test) => test(run)));
  }

  function renderTables() {
    const runs = shownRuns();
    const shownIds = new Set(runs.map((run) => run.id));
    const groups = state.data.groups.filter((group) => group.runs.some((id) => shownIds.has(id)));
    renderTable($("groups"), "groups", groupColumns(), groups, state.selectedGroups, (group) => group.id);
    renderTable($("runs"), "runs", runColumns(), runs, state.selectedRuns, (run) => run.id);
    $("run-count").textContent = `(${runs.length} of ${state.data.runs.length} shown)`;
    paintTables();
  }

  // each row drawn marked with its colour in the chart and the hyperparameter views (the one assignment, paint)
  function paintTables() {
    const plan = curvePlan();
    for (const [table, styles] of [["runs", plan.runStyles], ["groups", plan.groupStyles]]) {
      for (const row of $(table).querySelectorAll("tbody tr")) {
        const style = styles.get(row.dataset.id), swatch = row.querySelector(".row-swatch");
        row.dataset.color = style ? style.color : "";
        if (!swatch) continue;
        swatch.className = `swatch row-swatch swatch-${style ? style.marker : "circle"}`;
        swatch.style.background = style ? style.color : "transparent";
        swatch.title = style ? "its colour in the chart and the hyperparameter views" : "";
      }
    }
  }

  function applyFilter() {
    state.filter = board.filter.parse($("filter").value, {keys: state.keys || []});
    $("filter").classList.toggle("bad", state.filter.errors.length > 0);
    $("filter-errors").replaceChildren(...state.filter.errors.map((error) =>
      element("li", {}, element("code", {}, error.term), `: ${error.message} (ignored)`)));
    if (state.data) {
      renderTables();
      refreshChart();  // runs the filter lets in may need their records (grouped by a setting, or nothing ticked)
    }
  }

  // ------------------------------------------------------------------ chart
  // What the curves draw: each ticked group and run (what the filter hides left out), or with group
  // by a setting, a curve per value of it over the runs shown (every other setting and the seeds
  // pooled); with nothing ticked, the runs shown (at most DEFAULT_RUNS, the most recently updated).
  // Their colours are the page's one assignment (paint): every view takes a run's or group's from here.
  function curvePlan() {
    const shownList = shownRuns();
    const shown = new Set(shownList.map((run) => run.id));  // the filter drives the chart: what it hides is not drawn
    const groupBy = $("group-by").value;
    let entries = [], defaultView = null;
    if (groupBy) {
      const byValue = new Map();
      for (const run of shownList) {
        const value = run.settings[groupBy] ?? board.views.NO_VALUE;
        if (!byValue.has(value)) byValue.set(value, []);
        byValue.get(value).push(run.id);
      }
      const name = state.data.columns.find((c) => c.key === groupBy)?.name || groupBy;
      const index = board.views.valueIndex(state.data.runs, groupBy);
      entries = [...byValue.keys()].sort(naturalCompare).map((value) =>
        ({label: `${name}=${value}`, group: byValue.get(value).length, ids: byValue.get(value), style: index.get(value)}));
    } else if (!state.selectedRuns.size && !state.selectedGroups.size) {
      const updated = (run) => (board.isFiniteNumber(run.updated_at) ? run.updated_at : -Infinity);
      const newest = new Set(shownList.map((run, i) => ({run, i}))
        .sort((a, b) => updated(b.run) - updated(a.run) || a.i - b.i).slice(0, DEFAULT_RUNS).map(({run}) => run.id));
      entries = shownList.filter((run) => newest.has(run.id)).map((run, i) => ({label: run.name, group: 0, ids: [run.id], style: i}));
      defaultView = {drawn: entries.length, of: shownList.length};
    } else {
      for (const group of state.data.groups) {
        const ids = group.runs.filter((id) => state.runsById.has(id) && shown.has(id));
        if (state.selectedGroups.has(group.id) && ids.length) {
          entries.push({label: group.label, group: group.runs.length, ids, groupId: group.id});
        }
      }
      for (const run of state.data.runs) {
        if (state.selectedRuns.has(run.id) && shown.has(run.id)) entries.push({label: run.name, group: 0, ids: [run.id]});
      }
      entries = entries.map((entry, i) => ({...entry, style: i}));  // the ticked rows: colours in the order drawn
    }
    return {...paint(entries), defaultView};
  }

  // The page's one colour assignment. Coloured by a setting (colour by) when each curve's runs share one value
  // of it: the value's place among the setting's sorted values over all runs (views.valueIndex), so a value
  // keeps its colour whatever is ticked or filtered; else each curve its own (its `style`). A run takes the
  // colour of the first curve that draws it, a ticked group its curve's.
  function paint(entries) {
    const key = $("color-by").value === "none" ? "" : $("color-by").value;
    const textOf = (id) => state.runsById.get(id)?.settings[key] ?? board.views.NO_VALUE;
    const byValue = Boolean(key) && entries.every((entry) => new Set(entry.ids.map(textOf)).size <= 1);
    const index = byValue ? board.views.valueIndex(state.data.runs, key) : null;
    const painted = entries.map((entry) => (byValue && entry.ids.length
      ? {...entry, style: index.get(textOf(entry.ids[0])), value: textOf(entry.ids[0])} : entry));
    const runStyles = new Map(), groupStyles = new Map();
    for (const entry of painted) {
      const style = board.views.styleAt(entry.style);
      entry.ids.forEach((id) => runStyles.has(id) || runStyles.set(id, style));
      if (entry.groupId && !groupStyles.has(entry.groupId)) groupStyles.set(entry.groupId, style);
    }
    return {entries: painted, colouredBy: byValue ? key : "", runStyles, groupStyles};
  }

  function curveEntries() {
    return curvePlan().entries;
  }

  // the runs the curves draw (every run of every curve), each once, in the table's order
  function drawnRuns() {
    const ids = new Set(curveEntries().flatMap((entry) => entry.ids));
    return state.data.runs.filter((run) => ids.has(run.id));
  }

  // Each curve: its band (smoothed by step, one unit for the whole chart), the raw curve when
  // smoothing, and a cross at the last finite value of each of its runs that diverged.
  function chartCurves(metric, x, smoothing, entries = curveEntries()) {
    const recordsOf = (id) => state.records.get(id) || [];
    const unit = smoothing ? board.smoothingUnit(entries.flatMap((e) => e.ids.map((id) => board.series(recordsOf(id), metric).steps))) : 1;
    return entries.map(({label: name, group, ids, style: styleIndex}) => {
      const runsRecords = ids.map(recordsOf);
      const {xs, band} = board.groupCurve(runsRecords, metric, x, smoothing, unit);
      // a group's n: the seeds alive (a finite value) at its last step drawn, of those it has
      const alive = band.count.length ? band.count[band.count.length - 1] : 0;
      const label = !group ? name : `${name} (n=${alive === group ? alive : `${alive} of ${group} at the last step`}` +
                    `${ids.length < group ? `; ${group - ids.length} filtered out` : ""})`;
      const raw = smoothing ? board.groupCurve(runsRecords, metric, x, 0) : null;
      const diverged = ids.filter((id) => state.runsById.get(id)?.status === "diverged");
      const crosses = [];
      for (const id of diverged) {
        const {steps, values} = board.runCurve(recordsOf(id), metric, smoothing, unit);
        const placed = board.placed(steps, [recordsOf(id)], x);
        if (placed.index.length) crosses.push([placed.xs[placed.xs.length - 1], values[placed.index[placed.index.length - 1]]]);
      }
      return {label, ids, xs, band, raw, crosses, allDiverged: ids.length > 0 && diverged.length === ids.length,
              ...board.views.styleAt(styleIndex)};
    });
  }

  // The reference levels (chance, no retrieval) of a loss metric, from the runs drawn (each run's
  // summary.references, as it wrote them): drawn when every run drawn has the same ones, as compare draws them.
  function sharedReferences(metric, curves) {
    if (!metric.includes("loss")) return {};
    const found = new Set(curves.flatMap((curve) => curve.ids).map((id) => {
      const references = state.runsById.get(id)?.references || {};
      return JSON.stringify(Object.keys(references).sort().map((key) => [key, references[key]]));
    }));
    if (found.size !== 1) return {};
    return Object.fromEntries(JSON.parse([...found][0]).filter(([, value]) => board.isFiniteNumber(value)));
  }

  // uPlot's data: one x array (the union of the curves' x) and a column per series; `undefined` where a
  // series has no finite value (or no positive one, on a log axis), which the line passes over, and null
  // where a group's mean breaks: between two steps averaging a different number of runs (a seed diverged
  // or stopped), so a mean over n runs is never joined to one over another n. The mean's hover says n.
  // The reference levels are flat series, kept inside the y range.
  function aligned(curves, log, references = {}) {
    const breaks = curves.map((curve) => curve.xs.slice(1).map((x, i) => (curve.band.count[i + 1] !== curve.band.count[i]
      ? (curve.xs[i] + x) / 2 : null)).filter((x) => x !== null));
    const xs = [...new Set([...curves.flatMap((c) => c.xs), ...breaks.flat()])].sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    const column = (curve, values, gaps = []) => {
      const out = new Array(xs.length).fill(undefined);
      curve.xs.forEach((x, i) => {
        if (Number.isFinite(values[i]) && (!log || values[i] > 0)) out[at.get(x)] = values[i];
      });
      gaps.forEach((x) => { out[at.get(x)] = null; });
      return out;
    };
    const present = (values) => values.filter((v) => v != null);
    const data = [xs], series = [{}], bands = [], bulk = [], tails = [], crosses = [], starts = [];
    let points = 0;
    const value = (u, v) => board.formatNumber(v);
    curves.forEach((curve, c) => {
      const mean = column(curve, curve.band.mean, breaks[c]);
      points += present(mean).length;
      (curve.allDiverged ? tails : bulk).push(present(mean));
      if (!curve.allDiverged && present(mean).length) starts.push(present(mean)[0]);  // where the run began
      if (curve.raw) {  // faint, behind the smoothed curve; the hover shows both
        const raw = new Array(xs.length).fill(undefined);
        curve.raw.xs.forEach((x, i) => {
          const v = curve.raw.band.mean[i];
          if (at.has(x) && Number.isFinite(v) && (!log || v > 0)) raw[at.get(x)] = v;
        });
        breaks[c].forEach((x) => { raw[at.get(x)] = null; });
        data.push(raw);
        series.push({label: `${curve.label} (raw)`, class: "raw", stroke: curve.color + "59", dash: curve.dash, width: 1,
                     points: {show: false}, value});
      }
      crosses.push(...curve.crosses.map(([cx, cy]) => ({x: cx, y: cy, color: curve.color})));
      const counts = column(curve, curve.band.count);  // how many runs each point of the mean averages
      data.push(mean);
      series.push({label: curve.label, stroke: curve.color, dash: curve.dash, width: 1.6, counts,
                   points: {show: curve.xs.length < 5},
                   value: (u, v, s, i) => {  // the counts of the data drawn (drawPanel keeps them on the plot)
                     const n = u.attnCounts?.[s]?.[i];
                     return board.formatNumber(v) + (v != null && n > 1 ? ` (n=${n})` : "");
                   }});
      if (curve.band.std.some(Number.isFinite)) {
        const {lower, upper} = board.edges(curve.band);
        const spread = (values) => values.map((v, i) => (Number.isFinite(curve.band.std[i]) ? v : NaN));
        const up = column(curve, spread(upper), breaks[c]), down = column(curve, spread(lower), breaks[c]);
        data.push(up, down);
        (curve.allDiverged ? tails : bulk).push(present(up), present(down));
        const edge = {label: `${curve.label} ± std`, class: "band-edge", stroke: "rgba(0,0,0,0)", width: 1,
                      points: {show: false}, value};
        series.push(edge, {...edge});
        bands.push({series: [series.length - 2, series.length - 1], fill: curve.color + "2e"});
      }
    });
    // the y range: from the bulk of what is drawn (curves that did not all diverge), or everything
    const everything = $("y-all").checked;
    let limits = board.robustLimits(bulk.some((a) => a.length) && !everything ? bulk : bulk.concat(tails), log, !everything);
    if (limits && starts.length) {  // the whole run from its first logged step: its start is never cut off the top
      const [low, high] = limits, top = Math.max(...starts), bottom = Math.min(...starts);
      limits = log ? [Math.min(low, bottom / 1.05), Math.max(high, top * 1.05)]
        : [Math.min(low, bottom - 0.02 * (high - low)), Math.max(high, top + 0.02 * (high - low))];
    }
    const referenceLines = [];
    for (const [key, level] of Object.entries(references)) {
      if (log && !(level > 0)) continue;
      const look = REFERENCE_STYLE[key] || {label: key.replace(/_/g, " "), stroke: "#999999", dash: [4, 4]};
      data.push(xs.map(() => level));
      series.push({label: `${look.label} (${board.formatNumber(level)})`, class: "reference", stroke: look.stroke,
                   dash: look.dash, width: 1.2, points: {show: false}, value: () => board.formatNumber(level)});
      referenceLines.push({level, text: `${look.label} ${board.formatNumber(level)}`, stroke: look.stroke, dash: look.dash});
      if (limits) {  // inside the axes, with a margin
        const [low, high] = limits;
        limits = log ? [Math.min(low, level / 1.12), Math.max(high, level * 1.12)]
          : [Math.min(low, level - 0.04 * (high - low)), Math.max(high, level + 0.04 * (high - low))];
      }
    }
    return {data, series, bands, points, limits, crosses, references: referenceLines.length, referenceLines};
  }

  // tick labels by their size, each one distinct (views' tickTexts)
  function tickLabels(u, splits) {
    return board.tickTexts(splits);
  }

  // a log axis's ticks (logTicks): its decades, or within about a decade, round numbers between them
  function logSplits(u, axis, min, max) {
    return board.logTicks(min, max);
  }

  // a y axis as wide as its widest label
  function axisWidthOf(u, values) {
    if (!values || !values.length) return 50;
    const context = u.ctx;
    context.save();
    context.font = "12px system-ui, sans-serif";
    const widest = Math.max(...values.map((v) => context.measureText(String(v ?? "")).width));
    context.restore();
    return Math.ceil(widest) + 14 + 22;  // ticks and gap, and the axis label
  }

  // the main chart's, kept for tests
  function axisWidth(u, values) {
    const size = axisWidthOf(u, values);
    if (values && values.length) state.yAxis = {labels: values.filter((v) => v), size};
    return size;
  }

  // × at each diverged run's last finite value, held to the edge of the plot when off it
  function drawCrosses(u, crosses, holder) {
    const context = u.ctx, {left, top, width, height} = u.bbox;
    context.save();
    context.lineWidth = 2 * devicePixelRatio;
    let shown = 0;
    for (const cross of crosses) {
      const px = u.valToPos(cross.x, "x", true), raw = u.valToPos(cross.y, "y", true);
      if (!Number.isFinite(px) || px < left - 1 || px > left + width + 1) continue;
      const py = Math.min(Math.max(Number.isFinite(raw) ? raw : top, top), top + height);
      const r = 5 * devicePixelRatio;
      context.strokeStyle = cross.color;
      context.beginPath();
      context.moveTo(px - r, py - r); context.lineTo(px + r, py + r);
      context.moveTo(px - r, py + r); context.lineTo(px + r, py - r);
      context.stroke();
      if (py !== raw) {
        context.fillStyle = cross.color;
        context.font = `${10 * devicePixelRatio}px system-ui, sans-serif`;
        context.fillText(board.formatNumber(cross.y), px + r + 2, py + (raw < top ? 3 * r : -r));
      }
      shown += 1;
    }
    context.restore();
    holder.dataset.crosses = String(shown);
  }

  // the reference lines again over the curves (a run stalled at chance hides its line), each named at its right end
  function drawReferences(u, lines) {
    const context = u.ctx, {left, top, width, height} = u.bbox, ratio = devicePixelRatio;
    context.save();
    context.font = `${11 * ratio}px system-ui, sans-serif`;
    context.textAlign = "right";
    let lastLabel = -Infinity;  // the lowest label written so far (canvas y): a label that would touch it goes below its line
    const placed = lines.map((line) => ({...line, y: u.valToPos(line.level, "y", true)})).sort((a, b) => a.y - b.y);
    for (const line of placed) {
      const y = line.y;
      if (!Number.isFinite(y) || y < top || y > top + height) continue;
      context.strokeStyle = line.stroke;
      context.lineWidth = 1.2 * ratio;
      context.setLineDash(line.dash.map((d) => d * ratio));
      context.beginPath();
      context.moveTo(left, y);
      context.lineTo(left + width, y);
      context.stroke();
      context.setLineDash([]);
      const below = y - 14 * ratio < lastLabel;
      context.textBaseline = below ? "top" : "bottom";
      const at = below ? y + 2 * ratio : y - 2 * ratio;
      lastLabel = below ? at + 12 * ratio : at;
      context.lineWidth = 3 * ratio;
      context.strokeStyle = "rgba(255,255,255,0.9)";
      context.strokeText(line.text, left + width - 4 * ratio, at);
      context.fillStyle = "#333";
      context.fillText(line.text, left + width - 4 * ratio, at);
    }
    context.restore();
  }

  function chartOptions(panel, metric, x, log, built) {
    const bound = (id) => ($(id).value === "" ? null : Number($(id).value));
    return {
      width: Math.max(panel.el.clientWidth, 300),
      height: panel.height,
      series: [{label: X_LABELS[x]}, ...built.series.slice(1)],
      bands: built.bands,
      scales: {
        x: {time: false, range: (u, min, max) => {
          const from = bound("x-from"), to = bound("x-to");
          const low = from ?? min, high = to ?? max;
          return low < high ? [low, high] : [min, max];
        }},
        y: {...(log ? {distr: 3, log: 10} : {}), range: (u, min, max) => panel.yLimits || [min, max]},
      },
      axes: [{label: X_LABELS[x], values: tickLabels},
             {label: metric, values: tickLabels, size: panel.main ? axisWidth : axisWidthOf,
              ...(log ? {splits: logSplits, filter: (u, splits) => splits} : {})}],
      cursor: {drag: {x: true, y: false, setScale: false}},
      legend: {live: true},
      hooks: {
        draw: [(u) => drawReferences(u, panel.built?.referenceLines || []), (u) => drawCrosses(u, panel.crosses || [], panel.el)],
        setSelect: [(u) => {
          if (u.select.width < 4) return;
          $("x-from").value = Number(u.posToVal(u.select.left, "x").toPrecision(4));
          $("x-to").value = Number(u.posToVal(u.select.left + u.select.width, "x").toPrecision(4));
          u.setSelect({left: 0, top: 0, width: 0, height: 0}, false);
          refreshChart(true);
        }],
      },
    };
  }

  // the main chart, then each panel of the grid: the same curves (selection, filter, grouping,
  // smoothing, robust y range), each panel its own metric
  const mainPanel = {el: null, main: true, height: 360, metric: () => $("metric").value, plot: null, shape: ""};
  function allPanels() {
    return [mainPanel, ...state.panels];
  }

  function drawChart(force = false) {
    for (const panel of allPanels()) drawPanel(panel, force);
    drawHparams();
    paintTables();
    state.plot = mainPanel.plot;
    state.plotShape = mainPanel.shape;
    state.yLimits = mainPanel.yLimits;
    state.crosses = mainPanel.crosses;
    state.draws += 1;
    $("chart").dataset.draws = String(state.draws);
    writeViewToURL();
  }

  // one panel drawn: its metric's curves, its own uPlot; what it drew kept on the panel (and its
  // element's dataset, for tests)
  function drawPanel(panel, force = false) {
    const holder = panel.el;
    const metric = panel.metric(), x = $("x").value, smoothing = Number($("smoothing").value);
    const plan = curvePlan();
    const curves = metric ? chartCurves(metric, x, smoothing, plan.entries) : [];
    const yscale = $("yscale").value;
    const log = yscale === "auto" ? board.logScale(metric, curves.map((c) => c.band), state.data.wide_range, state.data.log_metrics)
                                  : yscale === "log";
    const built = aligned(curves, log, sharedReferences(metric, curves));
    panel.yLimits = built.limits;
    panel.crosses = built.crosses;
    panel.built = built;
    const empty = built.points === 0;
    if (panel.main) {
      const runsThere = state.data.runs.length > 0 && plan.defaultView?.of !== 0;
      $("chart-empty").textContent = curves.length && empty
        ? `No finite ${log ? "positive " : ""}values of ${metric} in the runs drawn yet.`
        : !state.data.runs.length ? "No runs to draw yet: they appear here as they start."
        : !runsThere ? "No run passes the filter."
        : "The rows ticked are hidden by the filter; tick others below, or clear the selection to draw the runs shown.";
      $("chart-empty").hidden = curves.length > 0 && !empty;
      const view = plan.defaultView;
      $("chart-default").textContent = view && view.drawn
        ? `Nothing ticked: drawing ${view.drawn === view.of ? `all ${view.drawn} runs` : `the ${view.drawn} most recently updated of ${view.of} runs`}` +
          `${$("filter").value.trim() ? " the filter shows" : ""}; tick runs or groups below to choose. ` +
          "Drag across the chart to set the x range, double-click to reset it."
        : "";
      $("chart-default").hidden = !$("chart-default").textContent;
      $("chart-note").textContent = new Set(curves.map((c) => c.color)).size < curves.length && !plan.colouredBy
        ? `${curves.length} curves: the ${PALETTE.length} colours repeat beyond the first ${PALETTE.length}, each repeat with its own dash (after ${PALETTE.length * DASHES.length} the dashes repeat too).`
        : plan.colouredBy && curves.length ? `Coloured by ${columnName(plan.colouredBy)} (colour by): curves of one value share its colour.` : "";
    } else if (panel.note) {
      panel.note.textContent = empty ? (curves.length ? `no finite values of ${metric} in the runs drawn yet` : "nothing to draw: tick runs or groups below") : "";
    }
    const shape = JSON.stringify([metric, x, log, $("y-all").checked, built.series.map((s) => [s.label, s.stroke])]);
    if (panel.plot && (force || empty || shape !== panel.shape)) {
      panel.plot.destroy();
      panel.plot = null;
    }
    if (!empty) {
      if (panel.plot) {
        panel.plot.attnCounts = built.series.map((s) => s.counts);
        panel.plot.setData(built.data);
      } else {
        panel.plot = new uPlot(chartOptions(panel, metric, x, log, built), built.data, holder);
        panel.plot.attnCounts = built.series.map((s) => s.counts);
        panel.plot.over.addEventListener("dblclick", () => {
          $("x-from").value = $("x-to").value = "";
          refreshChart(true);
        });
      }
    }
    panel.shape = shape;
    Object.assign(holder.dataset, {metric, series: String(empty ? 0 : curves.length), bands: String(empty ? 0 : built.bands.length),
                                   points: String(built.points), log: String(log), references: String(empty ? 0 : built.references),
                                   ylow: String(built.limits ? built.limits[0] : ""), yhigh: String(built.limits ? built.limits[1] : "")});
  }

  // ------------------------------------------------------------------ hyperparameter views
  // A metric's final or best value per run (the snapshot's `ends`, taken over every record) against a
  // setting, and parallel coordinates over the settings that differ among the runs drawn, the metric
  // last. The runs are the curves' (drawnRuns: the selection, the filter, group-by), each in its colour
  // in the chart (paint: the value of the colour setting, or its curve's). What was drawn is kept in `hp`
  // for the hover (and tests).
  const NO_VALUE = board.views.NO_VALUE;
  const hp = {rows: [], settings: [], scatter: null, parallel: null, hover: {scatter: null, parallel: null}};  // hover: run ids

  function hoveredRow(view) {  // the row of the run under the pointer, if it is still drawn
    const index = hp.rows.findIndex((row) => row.run.id === hp.hover[view]);
    return index < 0 ? null : index;
  }

  function hpChoice() {
    const color = $("color-by").value;
    return {metric: $("hp-metric").value, which: $("hp-value").value, x: $("hp-x").value,
            color: color === "none" ? "" : color};
  }

  function settingItem(run, key) {
    return {raw: run.values[key], text: run.settings[key] ?? NO_VALUE};
  }

  function columnName(key) {
    return state.data.columns.find((c) => c.key === key)?.name || key;
  }

  // each run drawn that logged the metric: {run, end, value (final or best; null: not finite), style}
  function hpRows(choice, plan) {
    return drawnRuns().filter((run) => run.ends && run.ends[choice.metric]).map((run) => {
      const end = run.ends[choice.metric];
      const style = plan.runStyles.get(run.id) || board.views.styleAt(0);
      return {run, end, value: choice.which === "best" ? end.best : end.final, style};
    });
  }

  // "eval_loss final", "eval_acc best" (the axis); with how best is taken, for the hover
  function metricLabel(choice, long = false) {
    const how = state.data.best_highest.includes(choice.metric) ? "highest" : "lowest";
    return `${choice.metric} ${choice.which === "best" ? "best" : "final"}` + (long && choice.which === "best" ? ` (${how})` : "");
  }

  // the metric's axis: log as the chart's y (its control, or auto's rule), the range from the bulk
  // of the values unless "all y values" is ticked
  function hpMetricAxis(choice, rows) {
    const values = rows.map((row) => row.value).filter(board.isFiniteNumber);
    const yscale = $("yscale").value;
    const log = yscale === "auto"
      ? board.logScale(choice.metric, [{low: values, high: values}], state.data.wide_range, state.data.log_metrics)
      : yscale === "log";
    return board.views.metricAxis(metricLabel(choice), values, log && values.some((v) => v > 0), $("y-all").checked);
  }

  // the settings whose values differ among the rows, in the table's order
  function differingSettings(rows) {
    return state.data.columns.map((c) => c.key)
      .filter((key) => new Set(rows.map((row) => settingItem(row.run, key).text)).size > 1);
  }

  function viewWidth(holder) {
    return Math.max(holder.clientWidth, 320);
  }

  function drawHparams() {
    if (!state.data) return;
    const choice = hpChoice(), plan = curvePlan();
    const rows = choice.metric && choice.x ? hpRows(choice, plan) : [];
    hp.rows = rows;
    hp.settings = differingSettings(rows);
    hp.metricAxis = rows.length ? hpMetricAxis(choice, rows) : null;
    const empty = rows.length === 0;
    $("hp-empty").hidden = !empty;
    $("hp-empty").textContent = !state.data.columns.length
      ? "The runs do not differ in any setting: there is nothing to draw against."
      : `Tick runs or groups (or group by a setting) to draw their ${choice.metric || "metric"} against their settings.`;
    $("hp-views").hidden = empty;
    const without = drawnRuns().length - rows.length;
    $("hp-note").textContent = without && !empty ? `${without} of the runs drawn above have not logged ${choice.metric}.` : "";
    renderColorLegend(plan, rows);
    drawHpScatter(choice);
    drawHpParallel(choice);
  }

  function drawHpScatter(choice) {
    const holder = $("hp-scatter"), rows = hp.rows;
    if (!rows.length) {
      hp.scatter = [];
      Object.assign(holder.dataset, {points: "0", crosses: "0", clamped: "0"});
      return;
    }
    const xAxis = board.views.settingAxis(columnName(choice.x), rows.map((row) => settingItem(row.run, choice.x)));
    const points = rows.map((row, i) => ({xItem: settingItem(row.run, choice.x), value: row.value, style: row.style, row: i}));
    hp.scatter = board.views.drawScatter(holder.querySelector("canvas"),
                                         {width: viewWidth(holder), height: 340, x: xAxis, y: hp.metricAxis, points,
                                          hover: hoveredRow("scatter")});
    Object.assign(holder.dataset, {
      points: String(hp.scatter.length), crosses: String(hp.scatter.filter((p) => p.crossed).length),
      clamped: String(hp.scatter.filter((p) => p.clamped && !p.crossed).length), x: choice.x, xkind: xAxis.kind,
      xlog: String(xAxis.log), ylog: String(hp.metricAxis.log), categories: JSON.stringify(xAxis.categories || []),
    });
  }

  function drawHpParallel(choice) {
    const holder = $("hp-parallel"), rows = hp.rows;
    if (!rows.length) {
      hp.parallel = [];
      Object.assign(holder.dataset, {axes: "0", lines: "0", crosses: "0", keys: "[]"});
      return;
    }
    const axes = hp.settings.map((key) => board.views.settingAxis(columnName(key), rows.map((row) => settingItem(row.run, key))));
    axes.push(hp.metricAxis);
    const lines = rows.map((row, i) => ({items: [...hp.settings.map((key) => settingItem(row.run, key)), row.value],
                                         style: row.style, row: i}));
    hp.parallel = board.views.drawParallel(holder.querySelector("canvas"),
                                           {width: viewWidth(holder), height: 340, axes, lines, hover: hoveredRow("parallel")});
    Object.assign(holder.dataset, {
      axes: String(axes.length), lines: String(hp.parallel.length),
      crosses: String(hp.parallel.filter((line) => line.points.some((p) => p.crossed)).length),
      keys: JSON.stringify([...hp.settings, choice.metric]),
    });
  }

  // one legend for both views: a swatch per value of the colour setting among the runs drawn, or (colours
  // by curve) per curve
  function renderColorLegend(plan, rows) {
    const legend = $("hp-legend");
    if (!rows.length) {
      legend.replaceChildren();
      return;
    }
    const counts = new Map();
    const drawn = new Set(rows.map((row) => row.run.id));
    for (const entry of plan.entries) {
      const n = entry.ids.filter((id) => drawn.has(id)).length;
      if (!n) continue;
      const text = plan.colouredBy ? entry.value : entry.label;
      if (!counts.has(text)) counts.set(text, {style: board.views.styleAt(entry.style), n: 0});
      counts.get(text).n += n;
    }
    const entries = [...counts.entries()].sort((a, b) => a[1].style.index - b[1].style.index);
    const repeats = entries.some(([, {style}]) => style.index >= PALETTE.length);
    legend.replaceChildren(...entries.map(([text, {style, n}]) => {
      const swatch = element("span", {class: `swatch swatch-${style.marker}`});
      swatch.style.background = style.color;
      return element("li", {"data-value": text, "data-color": style.color}, swatch,
                     plan.colouredBy ? `${columnName(plan.colouredBy)}=${text} ` : `${text} `, element("span", {class: "hint"}, `(${n})`));
    }), ...(repeats ? [element("li", {class: "hint"}, `the ${PALETTE.length} colours repeat beyond the first ${PALETTE.length}, ` +
                                   "each repeat with its own marker and dash")] : []));
  }

  // the hover's lines: the run, its status, its differing settings, the metric's value
  function describeRow(row, choice) {
    const lines = [row.run.name + (row.run.status === "completed" ? "" : ` (${row.run.status})`)];
    const keys = [...new Set([choice.x, ...hp.settings, ...(choice.color ? [choice.color] : [])])];
    lines.push(...keys.map((key) => `${columnName(key)}=${settingItem(row.run, key).text}`));
    const label = metricLabel(choice, true), end = row.end;
    if (board.isFiniteNumber(row.value)) {
      const off = hp.metricAxis.at(row.value).clamped ? " (off the axis, drawn at its edge)" : "";
      lines.push(`${label}: ${board.formatNumber(row.value)}` + (choice.which === "best" ? "" : ` at step ${end.step}`) + off);
    } else if (choice.which === "best") {
      lines.push(`${label}: no finite value`);
    } else {
      lines.push(`${label}: not finite at step ${end.step}` + (board.isFiniteNumber(end.last_finite)
        ? `; last finite ${board.formatNumber(end.last_finite)} at step ${end.last_finite_step}` : ""));
    }
    return lines;
  }

  function showTip(holder, at, lines) {
    const tip = holder.querySelector(".hp-tip");
    tip.hidden = !lines;
    if (!lines) return;
    tip.replaceChildren(element("strong", {}, lines[0]), ...lines.slice(1).map((line) => element("div", {}, line)));
    // beside the pointer, never over what it points at: to its right (left when there is no room),
    // above it (below near the top)
    const right = at.x + 14 + tip.offsetWidth <= holder.clientWidth;
    tip.style.left = `${Math.max(right ? at.x + 14 : at.x - 14 - tip.offsetWidth, 0)}px`;
    const above = at.y - tip.offsetHeight - 10;
    tip.style.top = `${above >= 0 ? above : at.y + 14}px`;
  }

  // the pointer over a view: the point (or line) nearest it, highlighted, and its values in a tip
  function hoverView(view, event) {
    const holder = $(`hp-${view}`);
    const x = event.offsetX, y = event.offsetY;
    const found = event.type === "mouseleave" ? null
      : view === "scatter" ? board.views.nearestPoint(hp.scatter || [], x, y)
        : board.views.nearestLine(hp.parallel || [], x, y);
    const row = found ? found.row : null, id = row == null ? null : hp.rows[row].run.id;
    if (id !== hp.hover[view]) {
      hp.hover[view] = id;
      (view === "scatter" ? drawHpScatter : drawHpParallel)(hpChoice());
    }
    holder.dataset.hover = id ?? "";
    showTip(holder, {x, y}, row == null ? null : describeRow(hp.rows[row], hpChoice()));
  }

  // a view control's value the URL asked for, kept until a snapshot offers it (settings columns and
  // metrics may arrive after the first draw) or the user chooses another
  const askedByURL = Object.fromEntries([["hp-metric", "hp_metric"], ["hp-x", "hp_x"], ["color-by", "color_by"]]
    .filter(([, name]) => params.get(name)).map(([id, name]) => [id, params.get(name)]));

  function controlValue(id) {
    return askedByURL[id] ?? $(id).value;
  }

  function fillHparamControls() {
    const choose = (select, options, fallback) => {
      const current = askedByURL[select.id] ?? (select.value || fallback);
      const known = options.some(([value]) => value === current);
      if (known) delete askedByURL[select.id];
      select.replaceChildren(...options.map(([value, label]) =>
        element("option", {value, selected: known ? value === current : false}, label)));
    };
    renderOnChange("hp-metric", state.data.metrics, () => {
      choose($("hp-metric"), state.data.metrics.map((m) => [m, m]), $("metric").value);
    });
    renderOnChange("hp-columns", state.data.columns, () => {
      const columns = state.data.columns.map((c) => [c.key, c.name]);
      choose($("hp-x"), columns, columns[0]?.[0]);
      choose($("color-by"), [["none", "— (per curve)"], ...columns], $("group-by").value || varyingSetting() || "none");
    });
  }

  // the setting that varies, for colour by: of the settings that differ between the runs (the seed aside),
  // the one with the fewest values, leaving out one that only follows the scatter's x (the same runs apart,
  // as d_v followed d_k), unless nothing else varies; "" when only the seed does
  function varyingSetting() {
    const runs = state.data.runs;
    const partition = (key) => {  // which runs share a value, whatever the values are
      const first = new Map();
      return JSON.stringify(runs.map((run, i) => {
        const value = run.settings[key] ?? NO_VALUE;
        if (!first.has(value)) first.set(value, i);
        return first.get(value);
      }));
    };
    const keys = state.data.columns.map((c) => c.key).filter((key) => key !== "seed");
    const size = (key) => new Set(runs.map((run) => run.settings[key] ?? NO_VALUE)).size;
    const fewest = (candidates) => candidates.reduce((best, key) => (best === null || size(key) < size(best) ? key : best), null);
    const x = $("hp-x").value;
    const apart = keys.filter((key) => !x || key === x || partition(key) !== partition(x));
    const notX = apart.filter((key) => key !== x);
    return fewest(notX.length ? notX : keys) || "";
  }

  // ------------------------------------------------------------------ downloads
  // the drawn data of a panel as CSV: a row per finite point of each curve drawn (the smoothed one
  // when smoothing; not the raw curve behind it nor the band's edges)
  function csvOf(panel) {
    const built = panel.built;
    const quote = (v) => (/[",\n]/.test(String(v)) ? `"${String(v).replace(/"/g, '""')}"` : String(v));
    const lines = [["curve", $("x").value, panel.metric()].map(quote).join(",")];
    if (built) {
      const xs = built.data[0];
      built.series.forEach((series, i) => {
        if (i === 0 || series.class) return;
        built.data[i].forEach((v, j) => { if (v !== null) lines.push([quote(series.label), xs[j], v].join(",")); });
      });
    }
    return lines.join("\n") + "\n";
  }

  function downloadCSV(panel, link) {
    if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href);
    const blob = new Blob([csvOf(panel)], {type: "text/csv"});
    state.lastDownload = blob;  // for tests (the page's policy keeps fetch from blob: URLs)
    link.href = URL.createObjectURL(blob);
    link.download = `${panel.metric().replace(/[^\w.-]+/g, "_")}.csv`;
  }

  // the panel's chart as PNG (uPlot's canvas: the curves and axes; the legend is the page's), made
  // synchronously so the link's href is set before the click follows it
  function downloadPNG(panel, link) {
    if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href);
    const canvas = panel.plot?.ctx.canvas;
    if (!canvas) return;
    const bytes = atob(canvas.toDataURL("image/png").split(",")[1]);
    const blob = new Blob([Uint8Array.from(bytes, (c) => c.charCodeAt(0))], {type: "image/png"});
    state.lastDownload = blob;
    link.href = URL.createObjectURL(blob);
    link.download = `${panel.metric().replace(/[^\w.-]+/g, "_")}.png`;
  }

  function pngLink(panel, id) {
    const link = element("a", {href: "#", class: "png-link", id, title: "the chart as PNG"}, "PNG");
    link.addEventListener("click", () => downloadPNG(panel, link));
    return link;
  }

  // a link that becomes a Blob URL of the panel's CSV as it is clicked
  function csvLink(panel, id) {
    const link = element("a", {href: "#", class: "csv-link", id, title: "the drawn curves' points as CSV"}, "CSV");
    link.addEventListener("click", () => downloadCSV(panel, link));
    return link;
  }

  // ------------------------------------------------------------------ the panel grid
  // panels=METRIC,METRIC in the URL: a card per metric below the main chart, kept there as they are
  // added, changed or removed
  function panelMetrics() {
    return state.panels.map((panel) => panel.metric());
  }

  // the view in the URL (replaced, not pushed), so a reload or a shared link opens it again: the
  // selection, filter, metric, axes, grouping, smoothing, panels and the run open; other parameters
  // (poll=) kept
  function writeViewToURL() {
    if (!state.viewReady) return;  // not before the URL's own view is taken
    const url = new URL(location.href);
    const list = (selected, all) => {
      const ids = all.filter((id) => selected.has(id));
      return ids.length && ids.length === all.length && all.length > 1 ? "all" : ids.join(",");
    };
    const view = {
      runs: list(state.selectedRuns, state.data.runs.map((r) => r.id)),
      groups: list(state.selectedGroups, state.data.groups.map((g) => g.id)),
      metric: $("metric").value, x: $("x").value === "step" ? "" : $("x").value,
      yscale: $("yscale").value === "auto" ? "" : $("yscale").value, yall: $("y-all").checked ? "1" : "",
      group_by: $("group-by").value, smooth: Number($("smoothing").value) ? $("smoothing").value : "",
      filter: $("filter").value, panels: panelMetrics().join(","), open: openRunParam(),
      hp_metric: controlValue("hp-metric"), hp_value: $("hp-value").value === "best" ? "best" : "",
      hp_x: controlValue("hp-x"), color_by: controlValue("color-by"),
    };
    for (const [name, value] of Object.entries(view)) {
      if (value) url.searchParams.set(name, value);
      else url.searchParams.delete(name);
    }
    if (url.href === location.href) return;
    try {
      history.replaceState(null, "", url.href);
    } catch (error) {  // a page opened from disk may not rewrite its URL: the view is then not kept
      state.viewReady = false;
    }
  }

  function addPanel(metric) {
    const select = element("select", {class: "panel-metric", "aria-label": "the panel's metric"});
    const title = element("h3", {class: "panel-title"}, metric);
    const plotHolder = element("div", {class: "panel-plot"});
    const note = element("p", {class: "hint panel-note"});
    const panel = {el: plotHolder, main: false, height: 240, metric: () => select.value || metric, plot: null, shape: "",
                   select, title, note};
    const remove = element("button", {type: "button", class: "panel-remove", title: "remove this panel"}, "remove");
    const card = element("div", {class: "panel-card"},
                         element("div", {class: "panel-head"}, title, select, csvLink(panel), pngLink(panel), remove), plotHolder, note);
    panel.card = card;
    fillPanelSelect(panel, metric);
    select.addEventListener("change", () => {
      title.textContent = select.value;
      writeViewToURL();
      drawPanel(panel, true);
    });
    remove.addEventListener("click", () => {
      panel.plot?.destroy();
      card.remove();
      state.panels.splice(state.panels.indexOf(panel), 1);
      writeViewToURL();
    });
    state.panels.push(panel);
    $("panels").append(card);
    return panel;
  }

  function fillPanelSelect(panel, wanted) {
    const metrics = state.data ? state.data.metrics : [];
    const current = panel.select.value || wanted;
    const names = metrics.includes(current) ? metrics : [current, ...metrics];
    panel.select.replaceChildren(...names.map((m) => element("option", {value: m, selected: m === current}, m)));
  }

  function addPanelFromControl() {
    const shown = new Set([mainPanel.metric(), ...panelMetrics()]);
    const metric = state.data.metrics.find((m) => !shown.has(m)) || state.data.metrics[0];
    if (!metric) return;
    const panel = addPanel(metric);
    writeViewToURL();
    drawPanel(panel, true);
  }

  function panelsFromParams() {
    const wanted = params.get("panels");
    if (!wanted || state.panels.length) return;
    wanted.split(",").filter(Boolean).forEach((metric) => addPanel(metric));
  }

  async function refreshChart(force = false) {
    setBusy(+1);
    try {
      await fetchRecords();
    } catch (error) {
      setLive(`cannot fetch records: ${error.message}`, true);
    }
    try {
      drawChart(force);
    } finally {
      setBusy(-1);
    }
  }

  let busy = 0;  // refreshes in flight (<body data-busy>)
  function setBusy(change) {
    busy += change;
    document.body.dataset.busy = String(busy);
  }

  // ------------------------------------------------------------------ a run's figures, experiments
  function figuresOf(entry) {
    return element("div", {class: "figures"}, ...entry.figures.map((figure) =>
      element("figure", {}, element("img", {src: figure.url, alt: figure.name, loading: "lazy"}),
              element("figcaption", {}, figure.name))));
  }

  async function drawFigures(run, button) {
    button.disabled = true;
    button.textContent = "drawing…";
    try {
      const answer = await getJSON(`api/plot?run=${encodeURIComponent(run.id)}`,
                                   {method: "POST", headers: {"X-Attn-Board": "1", "Content-Type": "application/json"},
                                    body: "{}"});
      run.figures = answer.figures;
      state.rendered.delete("run-details");
      renderRunDetails();
    } catch (error) {
      button.disabled = false;
      button.textContent = "draw figures";
      button.after(element("span", {class: "bad"}, ` could not draw them: ${error.message}`));
    }
  }

  // the id of the run that open= (or a click) names: its id, else its name
  function openRunId() {
    const wanted = state.openRun;
    if (wanted == null || state.runsById.has(wanted)) return wanted;
    return state.data?.runs.find((run) => run.name === wanted)?.id ?? null;
  }

  // the open run as the URL writes it: its name when no other run has it, else its id
  function openRunParam() {
    const run = state.runsById.get(openRunId());
    if (!run) return state.openRun || "";
    return state.data.runs.filter((other) => other.name === run.name).length === 1 ? run.name : run.id;
  }

  function openRun(id) {
    state.openRun = id;
    renderRunDetails();
    writeViewToURL();
    $("run-details").scrollIntoView({behavior: "smooth", block: "start"});
  }

  function renderRunDetails() {
    const section = $("run-details");
    const run = state.runsById.get(openRunId());
    section.hidden = !run;
    if (!run) return;
    renderOnChange("run-details", [run.id, run.status, run.figures, run.reason, run.outcome_said], () => {
      let figures;
      if (run.figures.length) figures = figuresOf(run);
      else if (embedded) {
        figures = element("p", {class: "no-figures"}, `no figures drawn for this run (attn plot ${run.path} draws them)`);
      } else {
        const button = element("button", {type: "button", id: "draw-figures"}, "draw figures");
        button.addEventListener("click", () => drawFigures(run, button));
        figures = element("p", {class: "no-figures"}, "no figures drawn for this run yet ", button);
      }
      const settings = state.data.columns.map((c) => `${c.name}=${run.settings[c.key] ?? "—"}`).join(", ");
      section.replaceChildren(
        element("h2", {}, `Run ${run.name} `, element("button", {type: "button", class: "close",
                                                                  onclick: () => { state.openRun = null; renderRunDetails(); writeViewToURL(); }}, "close")),
        element("p", {}, element("code", {}, run.path), ` · ${run.status}` + (run.reason ? ` (${run.reason})` : "") +
                (run.outcome_said ? ` · ${run.outcome_said}` : "") + (settings ? ` · ${settings}` : "")),
        figures,
        element("div", {id: "run-page"}, element("p", {class: "hint"}, "reading its config…")));
      loadRunPage(run.id);
    });
  }

  // a run's page: GET api/run (the export embeds them)
  const runPages = new Map();
  async function runPage(id) {
    if (embedded) return (embedded.run_pages || {})[id] || null;
    if (!runPages.has(id)) runPages.set(id, await getJSON(`api/run?run=${encodeURIComponent(id)}`));
    return runPages.get(id);
  }

  async function loadRunPage(id) {
    let page;
    try {
      page = await runPage(id);
    } catch (error) {
      $("run-page")?.replaceChildren(element("p", {class: "bad"}, `cannot read its config: ${error.message}`));
      return;
    }
    if (openRunId() !== id || !$("run-page")) return;
    if (!page) {
      $("run-page").replaceChildren(element("p", {class: "hint"}, "no config for this run in this page"));
      return;
    }
    const others = [...state.selectedRuns].filter((other) => other !== id && state.runsById.has(other));
    others.push(...state.data.runs.map((r) => r.id).filter((other) => other !== id && !others.includes(other)));
    const against = element("select", {id: "diff-against", "aria-label": "the run to diff against"},
                            element("option", {value: ""}, "—"),
                            ...others.map((other, i) => element("option", {value: other, selected: i === 0 && state.selectedRuns.has(other)},
                                                                state.runsById.get(other).name)));
    const diff = element("div", {id: "run-diff"});
    against.addEventListener("change", () => renderDiff(page, against.value, diff));
    const config = element("table", {id: "run-config", class: "board-table"},
                           element("thead", {}, element("tr", {}, element("th", {}, "key"), element("th", {}, "value"))),
                           element("tbody", {}, ...Object.entries(page.config).map(([key, value]) =>
                             element("tr", {"data-key": key}, element("td", {}, element("code", {}, key)),
                                     element("td", {}, configValue(value))))));
    const files = element("ul", {id: "run-files"}, ...page.files.map((file) =>
      element("li", {}, element("a", {href: file.url, "data-name": file.name, target: "_blank", rel: "noopener"}, file.name))));
    const checkpoints = page.checkpoints.length
      ? element("ul", {id: "run-checkpoints"}, ...page.checkpoints.map((c) =>
          element("li", {}, element("code", {}, c.name), ` ${board.formatNumber(c.bytes)} bytes`)))
      : element("p", {class: "hint", id: "run-checkpoints"}, "no checkpoints");
    $("run-page").replaceChildren(
      element("h3", {}, "Files"), files,
      element("h3", {}, "Checkpoints"), checkpoints,
      element("h3", {}, "Config ", element("label", {class: "hint"}, "diff against ", against)), diff,
      element("details", {open: true}, element("summary", {}, `resolved config (${Object.keys(page.config).length} keys)`), config));
    renderDiff(page, against.value, diff);
  }

  function configValue(value) {
    return value !== null && typeof value === "object" ? JSON.stringify(value) : String(value);
  }

  async function renderDiff(page, otherId, holder) {
    if (!otherId) {
      holder.replaceChildren(element("p", {class: "hint"}, "tick another run, or choose one, to see the keys that differ"));
      return;
    }
    let other;
    try {
      other = await runPage(otherId);
    } catch (error) {
      holder.replaceChildren(element("p", {class: "bad"}, `cannot read its config: ${error.message}`));
      return;
    }
    if (!other) return;
    const keys = [...new Set([...Object.keys(page.config), ...Object.keys(other.config)])].sort(naturalCompare);
    const differing = keys.filter((key) => JSON.stringify(page.config[key]) !== JSON.stringify(other.config[key]));
    const shown = (config, key) => (key in config ? configValue(config[key]) : "(absent)");
    holder.replaceChildren(differing.length
      ? element("table", {class: "board-table", id: "diff-table"},
                element("thead", {}, element("tr", {}, element("th", {}, "key"),
                                             element("th", {}, state.runsById.get(page.run)?.name ?? page.run),
                                             element("th", {}, state.runsById.get(otherId)?.name ?? otherId))),
                element("tbody", {}, ...differing.map((key) => element("tr", {"data-key": key},
                  element("td", {}, element("code", {}, key)), element("td", {}, shown(page.config, key)),
                  element("td", {}, shown(other.config, key))))))
      : element("p", {class: "hint", id: "diff-table"}, "the same config"));
  }

  function renderExperiments() {
    const container = $("experiments");
    const experiments = state.data.experiments;
    renderOnChange("experiments", experiments, () => {
      if (!experiments.length) {
        container.replaceChildren(element("p", {class: "hint"}, "No experiment directories under these paths."));
        return;
      }
      container.replaceChildren(...experiments.map((experiment) => {
        const details = element("details", {"data-id": experiment.id, open: state.openExperiments.has(experiment.id)});
        details.addEventListener("toggle", () => {
          details.open ? state.openExperiments.add(experiment.id) : state.openExperiments.delete(experiment.id);
        });
        const groupIds = new Set(experiment.runs.map((id) => state.runsById.get(id)?.group).filter(Boolean));
        const drawGroups = element("button", {type: "button", onclick: () => {
          groupIds.forEach((id) => state.selectedGroups.add(id));
          renderTables();
          refreshChart();
        }}, `draw its ${groupIds.size} groups`);
        const report = element("div", {class: "report"});
        if (experiment.report) report.innerHTML = board.markdown.render(experiment.report);  // escaped by render
        else report.append(element("p", {class: "hint"}, "no report.md yet (the sweep writes it when its runs are done)"));
        details.append(element("summary", {}, `${experiment.name} `,
                               element("span", {class: "hint"}, `${experiment.runs.length} runs`)),
                       element("p", {}, drawGroups), report, figuresOf(experiment));
        return details;
      }));
    });
  }

  function renderNotes() {
    renderOnChange("notes", state.data.skipped, () => {
      $("notes").replaceChildren(...state.data.skipped.map((s) => element("li", {}, element("code", {}, s.path), `: ${s.reason}`)));
    });
  }

  function renderAll() {
    $("title").textContent = state.data.title;
    const metric = $("metric");
    renderOnChange("metric", state.data.metrics, () => {
      const current = metric.value || params.get("metric") || state.data.metrics[0];
      metric.replaceChildren(...state.data.metrics.map((m) => element("option", {value: m, selected: m === current}, m)));
    });
    const groupBy = $("group-by");
    renderOnChange("group-by", state.data.columns, () => {
      const current = groupBy.value || params.get("group_by") || "";
      groupBy.replaceChildren(element("option", {value: "", selected: current === ""}, "the ticked rows"),
                              ...state.data.columns.map((c) => element("option", {value: c.key, selected: c.key === current},
                                                                       c.name)));
    });
    renderOnChange("panel-metrics", state.data.metrics, () => state.panels.forEach((panel) => fillPanelSelect(panel)));
    fillHparamControls();
    renderNotes();
    renderTables();
    renderRunDetails();
    renderExperiments();
    if (state.viewReady) drawHparams();  // the runs' ends may have moved without new records drawn
  }

  // ------------------------------------------------------------------ start, poll
  function selectFromParams() {
    const pick = (name, all, selected) => {
      const wanted = params.get(name);
      if (!wanted) return;
      (wanted === "all" ? all : wanted.split(",")).forEach((id) => selected.add(id));
    };
    pick("groups", state.data.groups.map((g) => g.id), state.selectedGroups);
    pick("runs", state.data.runs.map((r) => r.id), state.selectedRuns);
  }

  async function poll(seconds) {
    setBusy(+1);
    try {
      const response = await fetch("api/board", {cache: "no-cache"});
      const text = await response.text();
      if (!response.ok) throw new Error(JSON.parse(text).error || response.statusText);
      if (text !== state.dataText) {
        state.dataText = text;
        takeData(JSON.parse(text));
        renderAll();
      }
      if (state.viewReady && await fetchRecords()) drawChart();  // the first poll: the view is not set yet
      setLive(`live · updated ${new Date().toLocaleTimeString()}`);
    } catch (error) {
      setLive(`cannot reach the board (${error.message}); retrying`, true);
    } finally {
      setBusy(-1);
    }
    setTimeout(() => poll(seconds), seconds * 1000);
  }

  function start() {
    mainPanel.el = $("chart");
    $("add-panel").after(csvLink(mainPanel, "chart-csv"), " ", pngLink(mainPanel, "chart-png"));
    $("add-panel").addEventListener("click", addPanelFromControl);
    for (const [id, name] of [["x", "x"], ["yscale", "yscale"], ["filter", "filter"]]) {
      if (params.get(name)) $(id).value = params.get(name);
    }
    if (params.get("smooth")) $("smoothing").value = params.get("smooth");
    if (params.get("hp_value") === "best") $("hp-value").value = "best";
    $("y-all").checked = params.get("yall") === "1";
    $("smoothing-value").textContent = $("smoothing").value;
    $("group-by").addEventListener("change", () => {  // grouped by a setting: coloured by it (each curve one value)
      if (!$("group-by").value) return;
      $("color-by").value = $("group-by").value;
      delete askedByURL["color-by"];
    });
    for (const id of ["metric", "x", "yscale", "x-from", "x-to", "y-all", "group-by"]) $(id).addEventListener("change", () => refreshChart(true));
    for (const id of ["hp-metric", "hp-value", "hp-x", "color-by"]) {
      $(id).addEventListener("change", () => {
        delete askedByURL[id];  // the user's choice, not the URL's, from now on
        if (id === "color-by") {  // the page's colours: the curves and the tables' marks too
          paintTables();
          drawChart(true);
        } else drawHparams();
        writeViewToURL();
      });
    }
    for (const view of ["scatter", "parallel"]) {
      const canvas = $(`hp-${view}`).querySelector("canvas");
      canvas.addEventListener("mousemove", (event) => hoverView(view, event));
      canvas.addEventListener("mouseleave", (event) => hoverView(view, event));
    }
    $("smoothing").addEventListener("input", () => {
      $("smoothing-value").textContent = $("smoothing").value;
      drawChart();
    });
    $("filter").addEventListener("input", applyFilter);
    $("clear-selection").addEventListener("click", () => {  // back to the runs shown (curvePlan)
      state.selectedRuns.clear();
      state.selectedGroups.clear();
      renderTables();
      refreshChart();
    });
    window.addEventListener("resize", () => {
      allPanels().forEach((panel) => panel.plot?.setSize({width: Math.max(panel.el.clientWidth, 300), height: panel.height}));
      drawHparams();
    });
    if (embedded) {
      takeData(embedded);
      for (const [id, records] of Object.entries(embedded.records)) state.records.set(id, records);
      applyFilter();
      selectFromParams();
      panelsFromParams();
      renderAll();
      state.viewReady = true;
      drawChart();
      setLive(`static export: ${embedded.runs.length} runs, as they were when exported`);
      return;
    }
    const seconds = Number(params.get("poll")) > 0 ? Number(params.get("poll")) : DEFAULT_POLL_SECONDS;
    (async () => {
      await poll(seconds);
      if (!state.data) return;
      selectFromParams();
      panelsFromParams();
      state.viewReady = true;
      applyFilter();
      await refreshChart();
    })();
  }

  board.page = {state, hp, formatG, drawChart, drawHparams, naturalCompare, csvOf, panels: () => allPanels(), curvePlan,
                DEFAULT_RUNS};
  start();
})(window.AttnBoard = window.AttnBoard || {});
