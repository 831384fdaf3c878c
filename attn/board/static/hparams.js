// The colours every view shares, and the hyperparameter views (a metric's final or best value
// against a setting; parallel coordinates over the settings that differ), drawn on a canvas:
//
//   naturalCompare(a, b)        texts with their numbers read as numbers (grouping.natural_key)
//   styleAt(i)                  the i-th style: matplotlib's C0..C9, then the same colours with
//                               another dash (curves) and marker (points)
//   valueIndex(runs, key)       each value of a setting, as the table shows it, -> its place among
//                               the sorted distinct values over every run ("—", no value, last), so
//                               a value has one colour in every view, whatever is filtered or ticked
//   settingAxis(label, items)   an axis of a setting ({raw, text} per run): numeric when every value
//                               is a number (log when they are positive and span more than 10x),
//                               else categorical, its values evenly spaced in natural order
//   metricAxis(label, values, log, all)  an axis of a metric: from its lowest value to the top of
//                               the bulk of them (robustLimits; every one when all), a value above
//                               held to the top edge
//   drawScatter(canvas, spec)   the metric against a setting, a point per run; returns the points
//   drawParallel(canvas, spec)  an axis per setting, the metric last, a polyline per run; returns them
//   nearestPoint(points, x, y) / nearestLine(lines, x, y)   what the pointer is over, or null
//
// An axis places an item at a fraction of its length (0 at the low end) with at(item) ->
// {f, clamped}; f is NaN for an item it cannot place (a non-finite metric value: drawn at the
// top edge as a ×, as the curves draw a diverged run).
"use strict";
(function (board) {
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];  // matplotlib's C0..C9, as in the figures
  const DASHES = [[], [7, 4], [2, 3], [8, 3, 2, 3]];  // after the first ten
  const MARKERS = ["circle", "square", "triangle", "diamond"];  // after the first ten
  const NO_VALUE = "—";
  const WIDE_SETTING = 10;  // a numeric setting spanning more than this factor is drawn on a log axis
  const FONT = "11px system-ui, sans-serif";
  const NUMBER_IN_TEXT = /(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)/;

  // lr0.01 < lr0.03 < lr0.1, dk16 < dk256 (decimals and exponents too, as grouping.natural_key)
  function naturalCompare(a, b) {
    const pa = a.split(NUMBER_IN_TEXT), pb = b.split(NUMBER_IN_TEXT);
    for (let i = 0; i < Math.min(pa.length, pb.length); i++) {
      if (pa[i] === pb[i]) continue;
      if (i % 2) return Number(pa[i]) - Number(pb[i]) || pa[i].localeCompare(pb[i]);
      return pa[i].localeCompare(pb[i]);
    }
    return pa.length - pb.length;
  }

  function compareTexts(a, b) {  // natural order, no value last
    return (a === NO_VALUE) - (b === NO_VALUE) || naturalCompare(a, b);
  }

  // ------------------------------------------------------------------ colours
  function styleAt(i) {
    const round = Math.floor(i / PALETTE.length);
    return {index: i, color: PALETTE[i % PALETTE.length], dash: DASHES[round % DASHES.length],
            marker: MARKERS[round % MARKERS.length]};
  }

  function valueIndex(runs, key) {
    const texts = [...new Set(runs.map((run) => run.settings[key] ?? NO_VALUE))].sort(compareTexts);
    return new Map(texts.map((text, i) => [text, i]));
  }

  // ------------------------------------------------------------------ axes
  const identity = (v) => v;

  const labelled = (values) => {
    const texts = board.tickTexts(values);
    return values.map((value, i) => ({value, text: texts[i]}));
  };

  // a numeric axis from low to high, `pad` of its length left empty at each end; ticks: [{value, text}]
  function numericAxis(label, low, high, log, pad, ticks) {
    const t = log ? Math.log10 : identity;
    const a = t(low), b = t(high);
    const at = (value) => {
      if (!board.isFiniteNumber(value) || (log && value <= 0)) {
        return board.isFiniteNumber(value) ? {f: 0, clamped: true} : {f: NaN, clamped: true};
      }
      const f = b > a ? pad + (1 - 2 * pad) * (t(value) - a) / (b - a) : 0.5;
      return {f: Math.min(Math.max(f, 0), 1), clamped: f < 0 || f > 1};
    };
    return {label, kind: "numeric", log, low, high, at, ticks: ticks.map(({value, text}) => ({f: at(value).f, text}))};
  }

  function settingAxis(label, items) {
    if (items.length && items.every((item) => board.isFiniteNumber(item.raw))) {
      const values = items.map((item) => item.raw);
      const low = Math.min(...values), high = Math.max(...values);
      const log = low > 0 && high > WIDE_SETTING * low;
      const texts = new Map(items.map((item) => [item.raw, item.text]));  // a setting's few values as the table writes them
      const ticks = texts.size <= 8 ? [...texts].sort((x, y) => x[0] - y[0]).map(([value, text]) => ({value, text}))
        : labelled(log ? board.logTicks(low, high) : board.niceTicks(low, high, 5));
      const axis = numericAxis(label, low, high, log, 0.06, ticks);
      return {...axis, at: (item) => axis.at(item.raw)};
    }
    const categories = [...new Set(items.map((item) => item.text))].sort(compareTexts);
    const place = new Map(categories.map((text, i) => [text, (i + 0.5) / categories.length]));
    return {label, kind: "categorical", log: false, categories, at: (item) => ({f: place.get(item.text), clamped: false}),
            ticks: categories.map((text) => ({f: place.get(text), text}))};
  }

  function metricAxis(label, values, log, all) {
    const every = board.robustLimits([values], log, false) || (log ? [0.1, 10] : [0, 1]);
    const bulk = all ? every : board.robustLimits([values], log, true) || every;
    const [low, high] = [every[0], bulk[1]];  // only the top is cut: a run's low value is never off the axis
    return numericAxis(label, low, high, log, 0, labelled(log ? board.logTicks(low, high) : board.niceTicks(low, high, 5)));
  }

  // ------------------------------------------------------------------ canvas
  // the canvas sized to width x height CSS pixels, its context scaled to them
  function prepare(canvas, width, height) {
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    const context = canvas.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.clearRect(0, 0, width, height);
    context.font = FONT;
    return context;
  }

  function text(context, words, x, y, align = "left", baseline = "middle", color = "#333") {
    context.textAlign = align;
    context.textBaseline = baseline;
    context.lineWidth = 3;
    context.strokeStyle = "rgba(255,255,255,0.85)";  // a halo, so a label over lines stays readable
    context.strokeText(words, x, y);
    context.fillStyle = color;
    context.fillText(words, x, y);
  }

  // a text cut to fit `width` pixels, with an ellipsis
  function fitted(context, words, width) {
    if (context.measureText(words).width <= width) return words;
    let cut = words;
    while (cut.length > 1 && context.measureText(cut + "…").width > width) cut = cut.slice(0, -1);
    return cut + "…";
  }

  function drawMarker(context, style, x, y, r, hollow) {
    context.beginPath();
    if (style.marker === "square") context.rect(x - r, y - r, 2 * r, 2 * r);
    else if (style.marker === "triangle") {
      context.moveTo(x, y - 1.2 * r); context.lineTo(x + 1.1 * r, y + 0.8 * r); context.lineTo(x - 1.1 * r, y + 0.8 * r);
      context.closePath();
    } else if (style.marker === "diamond") {
      context.moveTo(x, y - 1.3 * r); context.lineTo(x + r, y); context.lineTo(x, y + 1.3 * r); context.lineTo(x - r, y);
      context.closePath();
    } else context.arc(x, y, r, 0, 2 * Math.PI);
    context.lineWidth = 1.5;
    context.strokeStyle = hollow ? style.color : "#fff";
    if (!hollow) {
      context.fillStyle = style.color;
      context.fill();
    }
    context.stroke();
  }

  function drawCross(context, color, x, y, r) {
    context.beginPath();
    context.moveTo(x - r, y - r); context.lineTo(x + r, y + r);
    context.moveTo(x - r, y + r); context.lineTo(x + r, y - r);
    context.lineWidth = 2;
    context.strokeStyle = color;
    context.stroke();
  }

  // a vertical axis at x from bottom (f = 0) to top (f = 1): its line, ticks and labels on `side`
  function drawVerticalAxis(context, axis, x, top, bottom, side, labelWidth) {
    context.strokeStyle = "#888";
    context.lineWidth = 1;
    context.beginPath();
    context.moveTo(x, top); context.lineTo(x, bottom);
    const direction = side === "left" ? -1 : 1;
    for (const tick of axis.ticks) {
      const y = bottom - tick.f * (bottom - top);
      context.moveTo(x, y); context.lineTo(x + 4 * direction, y);
    }
    context.stroke();
    for (const tick of axis.ticks) {
      const y = bottom - tick.f * (bottom - top);
      text(context, fitted(context, tick.text, labelWidth), x + 6 * direction, y, side === "left" ? "right" : "left");
    }
  }

  // tick labels along a horizontal axis, every k-th when they would overlap
  function drawHorizontalAxis(context, axis, left, right, y) {
    context.strokeStyle = "#888";
    context.lineWidth = 1;
    context.beginPath();
    context.moveTo(left, y); context.lineTo(right, y);
    const xs = axis.ticks.map((tick) => left + tick.f * (right - left));
    xs.forEach((x) => { context.moveTo(x, y); context.lineTo(x, y + 4); });
    context.stroke();
    const room = (right - left) / Math.max(axis.ticks.length, 1);
    const widest = Math.max(...axis.ticks.map((tick) => context.measureText(tick.text).width), 1);
    const every = axis.kind === "categorical" ? 1 : Math.max(1, Math.ceil((widest + 8) / room));
    axis.ticks.forEach((tick, i) => {
      if (i % every === 0) text(context, fitted(context, tick.text, room * every - 4), xs[i], y + 7, "center", "top");
    });
  }

  function gridLines(context, axis, left, right, top, bottom, vertical) {
    context.strokeStyle = "#eee";
    context.lineWidth = 1;
    context.beginPath();
    for (const tick of axis.ticks) {
      if (vertical) {
        const x = left + tick.f * (right - left);
        context.moveTo(x, top); context.lineTo(x, bottom);
      } else {
        const y = bottom - tick.f * (bottom - top);
        context.moveTo(left, y); context.lineTo(right, y);
      }
    }
    context.stroke();
  }

  function widestTick(context, axis) {
    return Math.max(...axis.ticks.map((tick) => context.measureText(tick.text).width), 10);
  }

  // ------------------------------------------------------------------ the scatter
  // spec: {width, height, x: axis, y: axis, points: [{xItem, value, style, row}], hover: row or null};
  // returns the points drawn, each with its pixel position (px, py) and whether it is off the axis
  function drawScatter(canvas, spec) {
    const context = prepare(canvas, spec.width, spec.height);
    const left = Math.min(widestTick(context, spec.y), 90) + 34, right = spec.width - 14, top = 12, bottom = spec.height - 42;
    gridLines(context, spec.y, left, right, top, bottom, false);
    if (spec.x.kind === "numeric") gridLines(context, spec.x, left, right, top, bottom, true);
    drawVerticalAxis(context, spec.y, left, top, bottom, "left", left - 30);
    drawHorizontalAxis(context, spec.x, left, right, bottom);
    text(context, spec.x.label + (spec.x.log ? " (log)" : ""), (left + right) / 2, spec.height - 4, "center", "bottom");
    context.save();
    context.translate(12, (top + bottom) / 2);
    context.rotate(-Math.PI / 2);
    text(context, spec.y.label + (spec.y.log ? " (log)" : ""), 0, 0, "center", "middle");
    context.restore();
    const drawn = spec.points.map((point) => {
      const fx = spec.x.at(point.xItem).f, fy = spec.y.at(point.value);
      const px = left + fx * (right - left);
      const crossed = !Number.isFinite(fy.f);
      const py = crossed ? top : bottom - fy.f * (bottom - top);
      return {...point, px, py, crossed, clamped: fy.clamped};
    });
    for (const point of drawn) {
      if (point.crossed) drawCross(context, point.style.color, point.px, point.py, 5);
      else drawMarker(context, point.style, point.px, point.py, point.row === spec.hover ? 6 : 4, point.clamped);
    }
    const hovered = drawn.find((point) => point.row === spec.hover);
    if (hovered) {
      context.beginPath();
      context.arc(hovered.px, hovered.py, 9, 0, 2 * Math.PI);
      context.lineWidth = 1.5;
      context.strokeStyle = "#222";
      context.stroke();
    }
    return drawn;
  }

  // ------------------------------------------------------------------ parallel coordinates
  // spec: {width, height, axes: [axis], lines: [{items: [an item per axis], style, row}], hover};
  // returns the lines drawn, each with its pixel points and whether its last value was crossed
  function drawParallel(canvas, spec) {
    const context = prepare(canvas, spec.width, spec.height);
    const n = spec.axes.length, margin = 70;
    const top = 34, bottom = spec.height - 16;
    const xs = spec.axes.map((_, i) => (n === 1 ? spec.width / 2 : margin + i * (spec.width - 2 * margin) / (n - 1)));
    const drawn = spec.lines.map((line) => {
      const points = line.items.map((item, i) => {
        const {f, clamped} = spec.axes[i].at(item);
        return {x: xs[i], y: Number.isFinite(f) ? bottom - f * (bottom - top) : top, crossed: !Number.isFinite(f), clamped};
      });
      return {...line, points};
    });
    const faded = spec.hover != null;
    for (const line of drawn) {
      if (line.row !== spec.hover) strokeLine(context, line, faded ? 0.25 : 0.75, 1.2);
    }
    const hovered = drawn.find((line) => line.row === spec.hover);
    if (hovered) strokeLine(context, hovered, 1, 3);
    const room = n === 1 ? margin : (spec.width - 2 * margin) / (n - 1) - 10;
    spec.axes.forEach((axis, i) => {
      drawVerticalAxis(context, axis, xs[i], top, bottom, i === n - 1 && n > 1 ? "left" : "right", Math.min(room, 80));
      const name = axis.label + (axis.log ? " (log)" : "");
      text(context, fitted(context, name, Math.max(room, margin) + 20), xs[i], top - 14, "center", "middle", "#111");
    });
    return drawn;
  }

  function strokeLine(context, line, alpha, width) {
    context.save();
    context.globalAlpha = alpha;
    context.strokeStyle = line.style.color;
    context.lineWidth = width;
    context.setLineDash(line.style.dash);
    context.beginPath();
    line.points.forEach((p, i) => (i ? context.lineTo(p.x, p.y) : context.moveTo(p.x, p.y)));
    context.stroke();
    context.setLineDash([]);
    for (const p of line.points) {
      if (p.crossed) drawCross(context, line.style.color, p.x, p.y, 5);
    }
    context.restore();
  }

  // ------------------------------------------------------------------ hover
  function nearestPoint(points, x, y, reach = 10) {
    let best = null, bestDistance = reach;
    for (const point of points) {
      const d = Math.hypot(point.px - x, point.py - y);
      if (d <= bestDistance) [best, bestDistance] = [point, d];
    }
    return best;
  }

  function segmentDistance(x, y, a, b) {
    const dx = b.x - a.x, dy = b.y - a.y, length = dx * dx + dy * dy;
    const t = length ? Math.min(Math.max(((x - a.x) * dx + (y - a.y) * dy) / length, 0), 1) : 0;
    return Math.hypot(a.x + t * dx - x, a.y + t * dy - y);
  }

  function nearestLine(lines, x, y, reach = 6) {
    let best = null, bestDistance = reach;
    for (const line of lines) {
      const points = line.points;
      const d = points.length === 1 ? Math.hypot(points[0].x - x, points[0].y - y)
        : Math.min(...points.slice(1).map((p, i) => segmentDistance(x, y, points[i], p)));
      if (d <= bestDistance) [best, bestDistance] = [line, d];
    }
    return best;
  }

  board.naturalCompare = naturalCompare;
  board.views = {PALETTE, DASHES, NO_VALUE, styleAt, valueIndex, settingAxis, metricAxis, drawScatter, drawParallel,
                 nearestPoint, nearestLine};
})(window.AttnBoard = window.AttnBoard || {});
