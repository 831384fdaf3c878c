// An experiment's report.md as HTML: the Markdown that attn.report writes
// (headings, paragraphs, pipe tables, nested - lists, `code`, **bold**,
// *italic*) and fenced code blocks. All text is escaped first: a report
// can add no element, attribute or link of its own.
"use strict";
(function (board) {
  function escape(text) {
    return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }

  function inline(text) {
    return escape(text)
      .replace(/`([^`]+)`/g, "<code>$1</code>")
      .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^*\w])\*([^*\s][^*]*)\*(?!\w)/g, "$1<em>$2</em>");
  }

  // a table row's cells; `\|` is a pipe inside a cell (attn.text.markdown_table writes it so)
  function cells(line) {
    return line.trim().replace(/^\||\|$/g, "").split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
  }

  function render(text) {
    const lines = text.replace(/\r\n?/g, "\n").split("\n");
    const html = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let match;
      if (!line.trim()) {
        i++;
      } else if (line.startsWith("```")) {
        const code = [];
        for (i++; i < lines.length && !lines[i].startsWith("```"); i++) code.push(lines[i]);
        i++;
        html.push(`<pre>${escape(code.join("\n"))}</pre>`);
      } else if ((match = /^(#{1,6})\s+(.*)$/.exec(line))) {
        const level = match[1].length;
        html.push(`<h${level}>${inline(match[2])}</h${level}>`);
        i++;
      } else if (line.trim().startsWith("|") && i + 1 < lines.length && /^\s*\|?\s*:?-+/.test(lines[i + 1])) {
        const header = cells(line);
        const body = [];
        for (i += 2; i < lines.length && lines[i].trim().startsWith("|"); i++) body.push(cells(lines[i]));
        html.push("<table><thead><tr>" + header.map((c) => `<th>${inline(c)}</th>`).join("") + "</tr></thead><tbody>" +
                  body.map((row) => "<tr>" + row.map((c) => `<td>${inline(c)}</td>`).join("") + "</tr>").join("") +
                  "</tbody></table>");
      } else if (/^\s*([-*]|\d+\.)\s+/.test(line)) {
        const depths = [];  // the indentation of each open list
        for (; i < lines.length && (match = /^(\s*)([-*]|\d+\.)\s+(.*)$/.exec(lines[i])); i++) {
          const indent = match[1].length;
          while (depths.length && indent < depths[depths.length - 1]) {
            html.push("</li></ul>");
            depths.pop();
          }
          if (!depths.length || indent > depths[depths.length - 1]) {
            html.push("<ul>");
            depths.push(indent);
          } else {
            html.push("</li>");
          }
          html.push(`<li>${inline(match[3])}`);
        }
        html.push("</li></ul>".repeat(depths.length));
      } else {
        const paragraph = [line];  // its first line whatever it starts with: every branch consumes a line
        for (i++; i < lines.length && lines[i].trim() && !/^(#{1,6}\s|```|\s*\||\s*([-*]|\d+\.)\s)/.test(lines[i]); i++) {
          paragraph.push(lines[i]);
        }
        html.push(`<p>${inline(paragraph.join(" "))}</p>`);
      }
    }
    return html.join("\n");
  }

  board.markdown = {render, escape};
})(window.AttnBoard = window.AttnBoard || {});
