// A small Markdown renderer and code highlighter for the chat page.
// Everything the model writes is escaped first; only the tags made here are
// HTML. Covers what chat models write: fenced code (highlighted), inline code,
// headings, bold/italic/strike, links (http, https and mailto only), ordered
// and bullet lists, block quotes, tables, horizontal rules and paragraphs.
// Works in the page (window.ShardMd) and in node (module.exports) for tests.
(function (root) {
  "use strict";

  function esc(s) {
    return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }

  const KEYWORDS = {
    common: "if else for while do return break continue switch case default try catch finally throw new class "
      + "import export from as in of true false null function const let var this static public private protected "
      + "async await yield def elif lambda None True False and or not is pass with raise except global fn let mut "
      + "impl struct enum trait pub use mod match where loop self Self crate super type const unsafe extern dyn move "
      + "ref int float double char void bool long short unsigned signed auto sizeof typedef namespace template "
      + "typename package func go chan defer select interface map range echo then fi done esac local",
  };
  const KW = new Set(KEYWORDS.common.split(/\s+/));

  // Comment syntax per language family.
  function commentStyle(lang) {
    const l = (lang || "").toLowerCase();
    if (["python", "py", "sh", "bash", "shell", "zsh", "ruby", "rb", "yaml", "yml", "toml", "perl", "r", "dockerfile", "makefile"].includes(l)) {
      return { line: "#", block: null };
    }
    if (["sql", "lua", "haskell", "hs"].includes(l)) return { line: "--", block: null };
    if (["html", "xml", "json", "text", "txt", "markdown", "md", ""].includes(l)) return { line: null, block: null };
    return { line: "//", block: ["/*", "*/"] };
  }

  // Highlights `code` (plain text) as HTML spans: hl-kw, hl-str, hl-num, hl-com.
  function highlight(code, lang) {
    const cs = commentStyle(lang);
    let out = "";
    let i = 0;
    const n = code.length;
    const span = (cls, text) => '<span class="' + cls + '">' + esc(text) + "</span>";
    while (i < n) {
      const c = code[i];
      if (cs.line && code.startsWith(cs.line, i)) {
        let j = code.indexOf("\n", i);
        if (j < 0) j = n;
        out += span("hl-com", code.slice(i, j));
        i = j;
      } else if (cs.block && code.startsWith(cs.block[0], i)) {
        let j = code.indexOf(cs.block[1], i + cs.block[0].length);
        j = j < 0 ? n : j + cs.block[1].length;
        out += span("hl-com", code.slice(i, j));
        i = j;
      } else if (c === '"' || c === "'" || c === "`") {
        let j = i + 1;
        while (j < n && code[j] !== c && code[j] !== "\n") j += code[j] === "\\" ? 2 : 1;
        j = Math.min(j + 1, n);
        out += span("hl-str", code.slice(i, j));
        i = j;
      } else if (/[0-9]/.test(c) && (i === 0 || !/[A-Za-z_0-9]/.test(code[i - 1]))) {
        const m = /^(0x[0-9a-fA-F_]+|[0-9][0-9_]*(\.[0-9_]+)?([eE][+-]?[0-9]+)?)/.exec(code.slice(i));
        out += span("hl-num", m[0]);
        i += m[0].length;
      } else if (/[A-Za-z_]/.test(c)) {
        const m = /^[A-Za-z_][A-Za-z_0-9]*/.exec(code.slice(i));
        out += KW.has(m[0]) ? span("hl-kw", m[0]) : esc(m[0]);
        i += m[0].length;
      } else {
        out += esc(c);
        i += 1;
      }
    }
    return out;
  }

  function safeUrl(u) {
    return /^(https?:|mailto:)/i.test(u) ? u : null;
  }

  // Inline Markdown on one escaped-on-output run of text.
  function inline(text) {
    // Code spans first, kept out of the other rules by placeholders.
    const codes = [];
    let s = text.replace(/`([^`\n]+)`/g, (_, c) => {
      codes.push("<code>" + esc(c) + "</code>");
      return "\u0000" + (codes.length - 1) + "\u0000";
    });
    s = esc(s);
    s = s.replace(/\[([^\]\n]+)\]\(([^)\s]+)\)/g, (all, label, url) => {
      const u = safeUrl(url.replace(/&amp;/g, "&"));
      return u ? '<a href="' + esc(u) + '" target="_blank" rel="noopener noreferrer">' + label + "</a>" : all;
    });
    s = s.replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>");
    s = s.replace(/__([^_\n]+)__/g, "<strong>$1</strong>");
    s = s.replace(/(^|[^*\w])\*([^*\n]+)\*(?!\w)/g, "$1<em>$2</em>");
    s = s.replace(/(^|[^_\w])_([^_\n]+)_(?!\w)/g, "$1<em>$2</em>");
    s = s.replace(/~~([^~\n]+)~~/g, "<del>$1</del>");
    return s.replace(/\u0000(\d+)\u0000/g, (_, k) => codes[+k]);
  }

  function isTableSep(line) {
    return /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/.test(line);
  }

  function cells(line) {
    return line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());
  }

  // Renders Markdown `src` to HTML. An unclosed code fence (a reply still
  // streaming) renders as code up to the end.
  function render(src) {
    const lines = (src || "").replace(/\r\n?/g, "\n").split("\n");
    let html = "";
    let i = 0;
    let para = [];
    const flush = () => {
      if (para.length) html += "<p>" + para.map(inline).join("<br>") + "</p>";
      para = [];
    };
    while (i < lines.length) {
      const line = lines[i];
      const fence = /^\s*(```+|~~~+)\s*([\w+#.-]*)/.exec(line);
      if (fence) {
        flush();
        const mark = fence[1];
        const lang = fence[2] || "";
        const body = [];
        i++;
        while (i < lines.length && !lines[i].trim().startsWith(mark)) body.push(lines[i++]);
        i++;
        const cls = lang ? ' class="language-' + esc(lang) + '"' : "";
        html += '<pre><code' + cls + ">" + highlight(body.join("\n"), lang) + "</code></pre>";
        continue;
      }
      const h = /^(#{1,6})\s+(.*)$/.exec(line);
      if (h) {
        flush();
        html += "<h" + h[1].length + ">" + inline(h[2].replace(/\s+#+\s*$/, "")) + "</h" + h[1].length + ">";
        i++;
        continue;
      }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
        flush();
        html += "<hr>";
        i++;
        continue;
      }
      if (/^\s*>/.test(line)) {
        flush();
        const q = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) q.push(lines[i++].replace(/^\s*>\s?/, ""));
        html += "<blockquote>" + render(q.join("\n")) + "</blockquote>";
        continue;
      }
      const li = /^(\s*)([-*+]|\d+[.)])\s+(.*)$/.exec(line);
      if (li) {
        flush();
        const ordered = /\d/.test(li[2]);
        const tag = ordered ? "ol" : "ul";
        const start = ordered ? parseInt(li[2], 10) : 1;
        html += ordered && start !== 1 ? '<ol start="' + start + '">' : "<" + tag + ">";
        while (i < lines.length) {
          const m = /^(\s*)([-*+]|\d+[.)])\s+(.*)$/.exec(lines[i]);
          if (!m || /\d/.test(m[2]) !== ordered) break;
          const item = [m[3]];
          i++;
          // Indented continuation lines (and nested lists) belong to the item.
          while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !/^(\s*)([-*+]|\d+[.)])\s+/.test(lines[i].slice(2)) ) item.push(lines[i++].trim());
          const sub = [];
          while (i < lines.length && /^\s{2,}([-*+]|\d+[.)])\s+/.test(lines[i])) sub.push(lines[i++].replace(/^\s{2,4}/, ""));
          html += "<li>" + item.map(inline).join("<br>") + (sub.length ? render(sub.join("\n")) : "") + "</li>";
        }
        html += "</" + tag + ">";
        continue;
      }
      if (line.includes("|") && i + 1 < lines.length && isTableSep(lines[i + 1])) {
        flush();
        const head = cells(line);
        i += 2;
        html += "<table><thead><tr>" + head.map((c) => "<th>" + inline(c) + "</th>").join("") + "</tr></thead><tbody>";
        while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
          html += "<tr>" + cells(lines[i]).map((c) => "<td>" + inline(c) + "</td>").join("") + "</tr>";
          i++;
        }
        html += "</tbody></table>";
        continue;
      }
      if (!line.trim()) {
        flush();
        i++;
        continue;
      }
      para.push(line);
      i++;
    }
    flush();
    return html;
  }

  const api = { render, highlight, escape: esc };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.ShardMd = api;
})(typeof window !== "undefined" ? window : this);
