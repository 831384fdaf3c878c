// Curves as attn.analysis.curves computes them, for the page to draw with any smoothing
// and x axis without asking the server (the static export has none):
//
//   series(records, key)        attn.store.runs.series: (steps, values), non-finite values left out
//   ema(values, beta, steps, u) curves.ema: time-weighted, bias-corrected, by step: d_t = β^(Δs/u),
//                               m_t = d_t m_{t-1} + (1 - d_t) y_t, w_t likewise of 1, ŷ_t = m_t / w_t
//   smoothingUnit(stepArrays)   curves.smoothing_unit: the smallest median gap between logged steps
//   robustLimits(arrays, log)   runs.robust_limits: y range from Q(0.05)..Q(0.95), widened by a quarter of
//                               its span, never beyond the values; robust=false holds them all
//   formatNumber(v)             a number by its size: 1.1e-4, 0.012, 3.45, 3.2k, 4.4e+20
//   bandStats(curves)           curves.band_stats: at each step of the union of the runs' steps,
//                               over the n runs with a finite value there, mean = Σx/n and
//                               std = sqrt(Σ(x - mean)² / (n - 1)) (NaN for n = 1), low, high
//   groupCurve(runs, ...)       curves.group_curve: x = the step, or the mean wall time of
//                               the runs that logged that step
//   edges(band)                 Band.edges: mean ± std clipped to [low, high]
//   logScale(metric, ...)       compare_figure.log_scale with yscale auto: log for a metric whose name holds
//                               one of the snapshot's log_metrics (compare_figure.LOG_METRICS), or a wide range
//   niceTicks(low, high, n)     about n ticks at round numbers (1, 2 or 5 times a power of ten)
//   logTicks(low, high)         a log axis's ticks: its decades (every k-th of more than eight); with fewer
//                               than three, 1-2-5 of each decade, then 1..9, then round numbers as on a
//                               linear axis, so an axis within one decade has labels too
//   tickTexts(values)           their labels by size (formatNumber), with more digits when two would read
//                               the same
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

  function smoothingUnit(stepArrays) {
    const gaps = [];
    for (const steps of stepArrays) {
      if (steps.length < 2) continue;
      const diffs = steps.slice(1).map((s, i) => s - steps[i]).sort((a, b) => a - b);
      const mid = diffs.length >> 1;
      const median = diffs.length % 2 ? diffs[mid] : (diffs[mid - 1] + diffs[mid]) / 2;
      if (median > 0) gaps.push(median);
    }
    return gaps.length ? Math.min(...gaps) : 1;
  }

  function ema(values, beta, steps, unit) {
    const smoothed = new Array(values.length);
    if (!values.length) return smoothed;
    const u = steps ? (unit || smoothingUnit([steps])) : 1;
    let numerator = 0, denominator = 0;
    for (let t = 0; t < values.length; t++) {
      const decay = t && steps ? beta ** ((steps[t] - steps[t - 1]) / u) : beta;
      numerator = decay * numerator + (1 - decay) * values[t];
      denominator = decay * denominator + (1 - decay);
      smoothed[t] = numerator / denominator;
    }
    return smoothed;
  }

  function quantile(sorted, q) {  // numpy's default (linear) quantile of sorted values
    const at = q * (sorted.length - 1), low = Math.floor(at), high = Math.ceil(at);
    return sorted[low] + (sorted[high] - sorted[low]) * (at - low);
  }

  function robustLimits(arrays, log, robust = true) {
    let values = arrays.flat().filter((v) => isFiniteNumber(v) && (!log || v > 0));
    if (!values.length) return null;
    if (log) values = values.map(Math.log10);
    values.sort((a, b) => a - b);
    let low = values[0], high = values[values.length - 1];
    if (robust && values.length >= 5) {
      const qLow = quantile(values, 0.05), qHigh = quantile(values, 0.95), pad = 0.25 * (qHigh - qLow);
      if (!log) low = Math.max(low, qLow - pad);  // on a log axis only the top is cut
      high = Math.min(high, qHigh + pad);
    }
    if (log) {
      const span = Math.max(high - low, 0.1);
      return [10 ** (low - 0.05 * span), 10 ** (high + 0.05 * span)];
    }
    const span = high - low || Math.max(Math.abs(high), 1) * 0.1;
    return [low - 0.05 * span, high + 0.05 * span];
  }

  function formatNumber(value) {
    if (!isFiniteNumber(value)) return "—";
    if (value === 0) return "0";
    const size = Math.abs(value);
    const trim = (text) => text.replace(/(\.\d*?)0+(e|$)/, "$1$2").replace(/\.(e|$)/, "$1");
    if (size < 1e-2 || size >= 1e15) return trim(value.toExponential(1)).replace("e+", "e+");
    if (size >= 1e3) {
      const [unit, scale] = size >= 1e12 ? ["T", 1e12] : size >= 1e9 ? ["G", 1e9] : size >= 1e6 ? ["M", 1e6] : ["k", 1e3];
      return trim((value / scale).toPrecision(2 + (Math.abs(value / scale) >= 10) + (Math.abs(value / scale) >= 100))) + unit;
    }
    return trim(value.toPrecision(3));
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

  function runCurve(records, metric, smoothing, unit) {
    const {steps, values} = series(records, metric);
    return {steps, values: smoothing ? ema(values, smoothing, steps, unit) : values};
  }

  // runsRecords: the records of each run of the group; unit: the smoothing's (default the group's)
  function groupCurve(runsRecords, metric, x, smoothing, unit) {
    if (smoothing && !unit) unit = smoothingUnit(runsRecords.map((records) => series(records, metric).steps));
    const band = bandStats(runsRecords.map((records) => runCurve(records, metric, smoothing, unit)));
    const {xs, index} = placed(band.steps, runsRecords, x);
    return {xs, band: take(band, index)};
  }

  function edges(band) {
    return {
      lower: band.mean.map((m, i) => Math.max(m - band.std[i], band.low[i])),
      upper: band.mean.map((m, i) => Math.min(m + band.std[i], band.high[i])),
    };
  }

  function logScale(metric, bands, wideRange, logMetrics) {
    if (logMetrics.some((word) => metric.includes(word))) return true;
    const values = bands.flatMap((b) => b.low.concat(b.high));
    if (!values.length) return false;
    const low = values.reduce((a, b) => Math.min(a, b)), high = values.reduce((a, b) => Math.max(a, b));
    return low > 0 && high > wideRange * low;
  }

  const exact = (value) => Number(value.toPrecision(12));  // 3 * 0.1 as 0.3

  function niceTicks(low, high, count = 5) {
    const span = high - low;
    if (!(span > 0)) return Number.isFinite(low) ? [low] : [];
    let best = null;
    const top = Math.ceil(Math.log10(span));
    for (let power = top - 3; power <= top; power++) {
      for (const multiple of [1, 2, 5]) {
        const step = multiple * 10 ** power;
        const first = Math.ceil(low / step - 1e-9), last = Math.floor(high / step + 1e-9), n = last - first + 1;
        const miss = Math.abs(n - count) + (n < 2 ? 100 : 0);
        if (best === null || miss < best.miss) best = {step, first, last, miss};
      }
    }
    const ticks = [];
    for (let k = best.first; k <= best.last; k++) ticks.push(k === 0 ? 0 : exact(k * best.step));
    return ticks;
  }

  function logTicks(low, high) {
    if (!(low > 0 && high > low)) return niceTicks(low, high);
    const inside = (values) => values.filter((v) => v >= low * (1 - 1e-9) && v <= high * (1 + 1e-9));
    const powers = [];
    for (let k = Math.floor(Math.log10(low)); k <= Math.ceil(Math.log10(high)); k++) powers.push(k);
    const decades = inside(powers.map((k) => Number(`1e${k}`)));
    if (decades.length >= 3) {
      const every = Math.ceil(decades.length / 8);
      return decades.filter((v) => Math.round(Math.log10(v)) % every === 0);
    }
    for (const multiples of [[1, 2, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9]]) {
      const ticks = inside(powers.flatMap((k) => multiples.map((m) => exact(m * Number(`1e${k}`)))));
      if (ticks.length >= 3) return ticks;
    }
    return niceTicks(low, high, 4).filter((v) => v > 0);
  }

  function tickTexts(values) {
    const texts = values.map((v) => (isFiniteNumber(v) ? formatNumber(v) : ""));
    const shown = texts.filter(Boolean);
    if (new Set(shown).size === shown.length) return texts;
    for (let digits = 4; digits <= 12; digits++) {
      const finer = values.map((v) => (isFiniteNumber(v) ? String(Number(v.toPrecision(digits))) : ""));
      const kept = finer.filter(Boolean);
      if (new Set(kept).size === kept.length) return finer;
    }
    return texts;
  }

  Object.assign(board, {isFiniteNumber, series, ema, smoothingUnit, robustLimits, formatNumber, runCurve, bandStats,
                        groupCurve, placed, edges, logScale, niceTicks, logTicks, tickTexts});
})(window.AttnBoard = window.AttnBoard || {});
