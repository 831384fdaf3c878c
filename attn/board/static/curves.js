// Curves as attn.curves computes them, for the page to draw with any smoothing
// and x axis without asking the server (the static export has none):
//
//   series(records, key)        plots.series: (steps, values), non-finite values left out
//   ema(values, beta)           curves.ema: m_t = β m_{t-1} + (1 - β) y_t,  ŷ_t = m_t / (1 - β^t)
//   bandStats(curves)           curves.band_stats: at each step of the union of the runs' steps,
//                               over the n runs with a finite value there, mean = Σx/n and
//                               std = sqrt(Σ(x - mean)² / (n - 1)) (NaN for n = 1), low, high
//   groupCurve(runs, ...)       curves.group_curve: x = the step, or the mean wall time of
//                               the runs that logged that step
//   edges(band)                 Band.edges: mean ± std clipped to [low, high]
//   logScale(metric, ...)       compare_figure.log_scale with yscale auto
//
// tests/test_board.py holds groupCurve to curves.group_curve on the same runs.
"use strict";
(function (board) {
  function isFiniteNumber(value) {
    return typeof value === "number" && Number.isFinite(value);
  }

  function series(records, key) {
    const steps = [], values = [];
    for (const record of records) {
      if (isFiniteNumber(record[key])) {
        steps.push(record.step);
        values.push(record[key]);
      }
    }
    return {steps, values};
  }

  function ema(values, beta) {
    const smoothed = new Array(values.length);
    let moment = 0;
    for (let t = 1; t <= values.length; t++) {
      moment = beta * moment + (1 - beta) * values[t - 1];
      smoothed[t - 1] = moment / (1 - beta ** t);
    }
    return smoothed;
  }

  function bandStats(curves) {
    const steps = [...new Set(curves.flatMap((c) => c.steps))].sort((a, b) => a - b);
    const column = new Map(steps.map((step, i) => [step, i]));
    const table = curves.map((curve) => {  // (R, S), NaN where a run has no value
      const row = new Array(steps.length).fill(NaN);
      curve.steps.forEach((step, i) => { row[column.get(step)] = curve.values[i]; });
      return row;
    });
    const band = {steps: [], mean: [], std: [], count: [], low: [], high: []};
    steps.forEach((step, s) => {
      const present = table.map((row) => row[s]).filter(Number.isFinite);
      if (!present.length) return;
      const mean = present.reduce((a, b) => a + b, 0) / present.length;
      const squares = present.reduce((a, x) => a + (x - mean) ** 2, 0);
      band.steps.push(step);
      band.mean.push(mean);
      band.std.push(present.length >= 2 ? Math.sqrt(squares / (present.length - 1)) : NaN);
      band.count.push(present.length);
      band.low.push(Math.min(...present));
      band.high.push(Math.max(...present));
    });
    return band;
  }

  function take(band, index) {
    const taken = {};
    for (const key of Object.keys(band)) taken[key] = index.map((i) => band[key][i]);
    return taken;
  }

  // (x coordinates, index into steps) of the steps that have an x coordinate
  function placed(steps, runsRecords, x) {
    if (x === "step") return {xs: steps.slice(), index: steps.map((_, i) => i)};
    const clock = bandStats(runsRecords.map((records) => series(records, x)));
    const at = new Map(clock.steps.map((step, i) => [step, i]));
    const xs = [], index = [];
    steps.forEach((step, i) => {
      if (at.has(step)) {
        xs.push(clock.mean[at.get(step)]);
        index.push(i);
      }
    });
    return {xs, index};
  }

  function runCurve(records, metric, smoothing) {
    const {steps, values} = series(records, metric);
    return {steps, values: ema(values, smoothing)};
  }

  // runsRecords: the records of each run of the group
  function groupCurve(runsRecords, metric, x, smoothing) {
    const band = bandStats(runsRecords.map((records) => runCurve(records, metric, smoothing)));
    const {xs, index} = placed(band.steps, runsRecords, x);
    return {xs, band: take(band, index)};
  }

  function edges(band) {
    return {
      lower: band.mean.map((m, i) => Math.max(m - band.std[i], band.low[i])),
      upper: band.mean.map((m, i) => Math.min(m + band.std[i], band.high[i])),
    };
  }

  function logScale(metric, bands, wideRange) {
    if (metric.includes("loss")) return true;
    const values = bands.flatMap((b) => b.low.concat(b.high));
    if (!values.length) return false;
    const low = values.reduce((a, b) => Math.min(a, b)), high = values.reduce((a, b) => Math.max(a, b));
    return low > 0 && high > wideRange * low;
  }

  Object.assign(board, {isFiniteNumber, series, ema, bandStats, groupCurve, edges, logScale});
})(window.AttnBoard = window.AttnBoard || {});
