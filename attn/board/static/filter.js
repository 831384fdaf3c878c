// The filter box: terms separated by spaces, all of which a run must pass.
//
//   d_k=256  scale=none  eval_loss<0.1  status=running  outcome=stalled  seed!=0  copy
//
// A term is FIELD OP VALUE with OP one of = == != < <= > >=, or a bare word,
// which the run's name must contain. FIELD is name, status, outcome (the
// run's class: learned, "learned then lost", stalled, slow, diverged; none
// while it runs), group, experiment, step, a metric of the table (eval_loss and eval_accuracy are
// the final ones; best_eval_loss, best_eval_accuracy, steps_to_99), or a
// setting by its dotted key or any suffix of it that names one key (d_k,
// model.d_k). A number compares as a number; anything else compares, with
// = and != only, to the setting as the table shows it (case ignored).
// A value with spaces goes in double quotes. A run without the field (a
// setting its task does not read, a metric it has not logged) passes only
// != terms. A term that cannot be read is returned among `errors` and
// filters nothing.
"use strict";
(function (board) {
  const TERM = /^([A-Za-z_][\w.\/-]*?)(<=|>=|!=|==|=|<|>)(.*)$/;
  const METRIC_FIELDS = {
    eval_loss: "final_eval_loss", eval_accuracy: "final_eval_accuracy", final_eval_loss: "final_eval_loss",
    final_eval_accuracy: "final_eval_accuracy", best_eval_loss: "best_eval_loss",
    best_eval_accuracy: "best_eval_accuracy", steps_to_99: "steps_to_99", step: "step",
  };
  // field -> the run's property: the page adds group_label and experiment_name to each run
  const TEXT_FIELDS = {name: "name", status: "status", outcome: "outcome", group: "group_label", experiment: "experiment_name"};
  const COMPARE = {
    "=": (a, b) => a === b, "==": (a, b) => a === b, "!=": (a, b) => a !== b,
    "<": (a, b) => a < b, "<=": (a, b) => a <= b, ">": (a, b) => a > b, ">=": (a, b) => a >= b,
  };

  // the terms of the text, split at spaces outside double quotes
  function split(text) {
    const terms = [];
    let current = "", quoted = false;
    for (const c of text) {
      if (c === '"') quoted = !quoted;
      else if (/\s/.test(c) && !quoted) {
        if (current) terms.push(current);
        current = "";
        continue;
      }
      current += c;
    }
    if (current) terms.push(current);
    return terms;
  }

  // the setting keys that FIELD names: the key itself, else every key it is a dotted suffix of
  function settingKeys(field, keys) {
    if (keys.includes(field)) return [field];
    return keys.filter((key) => key.endsWith("." + field));
  }

  // fields: {keys: every setting key of the runs}; returns {tests: [run => bool], errors: [{term, message}]}
  function parse(text, fields) {
    const tests = [], errors = [];
    for (const term of split(text)) {
      const match = TERM.exec(term);
      if (!match) {
        if (/[<>=!]/.test(term)) {
          errors.push({term, message: "expected FIELD OP VALUE with OP one of = != < <= > >=, e.g. d_k=256"});
        } else {
          const word = term.replace(/"/g, "").toLowerCase();
          tests.push((run) => run.name.toLowerCase().includes(word));
        }
        continue;
      }
      const [, field, op, rawValue] = match;
      const value = rawValue.replace(/^"(.*)"$/, "$1");
      if (!value) {
        errors.push({term, message: `no value after ${op}`});
        continue;
      }
      const number = value.trim() !== "" && Number.isFinite(Number(value)) ? Number(value) : null;
      if (number === null && !["=", "==", "!="].includes(op)) {
        errors.push({term, message: `${op} needs a number; got ${JSON.stringify(value)}`});
        continue;
      }
      let read;  // run -> {number, text} or undefined when the run has no such field
      if (Object.hasOwn(METRIC_FIELDS, field)) {
        const key = METRIC_FIELDS[field];
        read = (run) => (board.isFiniteNumber(run[key]) ? {number: run[key], text: String(run[key])} : undefined);
      } else if (Object.hasOwn(TEXT_FIELDS, field)) {
        const property = TEXT_FIELDS[field];
        read = (run) => (run[property] == null ? undefined : {number: null, text: String(run[property])});
      } else {
        const keys = settingKeys(field, fields.keys);
        if (!keys.length) {
          const guess = closest(field, [...fields.keys, ...fields.keys.map((k) => k.split(".").pop()),
                                        ...Object.keys(METRIC_FIELDS), ...Object.keys(TEXT_FIELDS)]);
          errors.push({term, message: `unknown field ${JSON.stringify(field)}` + (guess ? `; did you mean ${guess}?` : "") +
                       "; expected a setting (e.g. d_k), " +
                       `a metric (${Object.keys(METRIC_FIELDS).join(", ")}) or ${Object.keys(TEXT_FIELDS).join(", ")}`});
          continue;
        }
        if (keys.length > 1) {
          errors.push({term, message: `${JSON.stringify(field)} names several settings: ${keys.join(", ")}; write more of the key`});
          continue;
        }
        const key = keys[0];
        read = (run) => (Object.hasOwn(run.settings, key)
          ? {number: board.isFiniteNumber(run.values[key]) ? run.values[key] : null, text: run.settings[key]}
          : undefined);
      }
      const compare = COMPARE[op];
      tests.push((run) => {
        const got = read(run);
        if (got === undefined) return op === "!=";
        if (number !== null && got.number !== null) return compare(got.number, number);
        if (number !== null && op !== "=" && op !== "==" && op !== "!=") return false;
        return compare(got.text.toLowerCase(), value.toLowerCase());
      });
    }
    return {tests, errors};
  }

  // edit distance (insertions, deletions, substitutions) between two strings
  function distance(a, b) {
    let row = Array.from({length: b.length + 1}, (_, j) => j);
    for (let i = 1; i <= a.length; i++) {
      const next = [i];
      for (let j = 1; j <= b.length; j++) {
        next.push(Math.min(row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1)));
      }
      row = next;
    }
    return row[b.length];
  }

  // the candidate nearest a mistyped name, if it is near enough to be what was meant
  function closest(name, candidates) {
    let best = null, bestDistance = Infinity;
    for (const candidate of new Set(candidates)) {
      const d = distance(name.toLowerCase(), candidate.toLowerCase());
      if (d < bestDistance) [best, bestDistance] = [candidate, d];
    }
    return best !== null && bestDistance <= Math.max(2, Math.floor(name.length / 3)) ? best : null;
  }

  board.filter = {parse, split, closest};
})(window.AttnBoard = window.AttnBoard || {});
