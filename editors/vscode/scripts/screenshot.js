#!/usr/bin/env node
// Render a .flow file highlighted by the extension's grammar and capture it as a PNG, the way
// VS Code's Dark Modern theme colours these scopes. Tokens come from tokenize.js (the real
// grammar through vscode-textmate); the picture is taken by headless Chromium.
//
//   apt-get install chromium        # once; Debian's package, /usr/bin/chromium
//   node scripts/screenshot.js ../../examples/image_chat/pipeline.flow images/screenshot.png
"use strict";

const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { execFileSync } = require("node:child_process");
const { loadGrammar, tokenize } = require("./tokenize");

// The most specific matching prefix wins; the colours are Dark Modern's for these scopes.
const THEME = [
  ["comment", "#6A9955"],
  ["string", "#CE9178"],
  ["constant.character.escape", "#D7BA7D"],
  ["constant.numeric", "#B5CEA8"],
  ["keyword.other.unit", "#B5CEA8"],
  ["constant.language", "#569CD6"],
  ["storage", "#569CD6"],
  ["keyword.control", "#C586C0"],
  ["keyword.operator", "#D4D4D4"],
  ["keyword", "#C586C0"],
  ["entity.name.type", "#4EC9B0"],
  ["support.type", "#4EC9B0"],
  ["support.class", "#4EC9B0"],
  ["entity.name.function", "#DCDCAA"],
  ["entity.name.namespace", "#4EC9B0"],
  ["entity.name.variable", "#9CDCFE"],
  ["entity.other.attribute-name", "#9CDCFE"],
  ["variable", "#9CDCFE"],
  ["support.constant", "#4FC1FF"],
  ["punctuation", "#D4D4D4"],
  ["punctuation.definition.comment", "#6A9955"],
  ["punctuation.definition.string", "#CE9178"],
];

function colour(scopes) {
  let best = ["", "#CCCCCC"];
  for (const scope of scopes) {
    for (const [prefix, hex] of THEME) {
      if ((scope === prefix || scope.startsWith(prefix + ".")) && prefix.length >= best[0].length) best = [prefix, hex];
    }
  }
  return best[1];
}

const escape = (text) => text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

function html(lines, title) {
  const rows = lines.map((tokens, index) => {
    const code = tokens.map((t) => `<span style="color:${colour(t.scopes)}">${escape(t.text)}</span>`).join("");
    return `<div class="row"><span class="no">${index + 1}</span>${code || " "}</div>`;
  });
  return `<!doctype html><meta charset="utf-8"><style>
body{margin:0;background:#1F1F1F;font:15px/21px "DejaVu Sans Mono",monospace;color:#CCCCCC}
.tab{background:#181818;color:#FFFFFF;padding:7px 16px;border-bottom:1px solid #2B2B2B;font-family:sans-serif;font-size:13px}
.code{padding:10px 0}.row{white-space:pre}.no{display:inline-block;width:44px;margin-right:20px;text-align:right;color:#6E7681}
</style><div class="tab">${escape(title)}</div><div class="code">${rows.join("\n")}</div>`;
}

async function main([source, output, browser = "/usr/bin/chromium"]) {
  if (!source || !output) {
    process.stderr.write("usage: screenshot.js FILE.flow OUT.png [CHROMIUM]\n");
    process.exit(2);
  }
  const lines = tokenize(await loadGrammar(), fs.readFileSync(source, "utf8"));
  while (lines.length && lines[lines.length - 1].every((t) => !t.text.trim())) lines.pop();
  const page = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "flowc-shot-")), "page.html");
  fs.writeFileSync(page, html(lines, path.basename(path.dirname(source)) + "/" + path.basename(source)));
  const height = 33 + 20 + lines.length * 21;
  execFileSync(browser, [
    "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1",
    `--window-size=1120,${height}`, `--screenshot=${path.resolve(output)}`, `file://${page}`,
  ], { stdio: "ignore" });
  fs.rmSync(path.dirname(page), { recursive: true });
  process.stdout.write(`wrote ${output}\n`);
}

main(process.argv.slice(2)).catch((error) => {
  process.stderr.write(`screenshot.js: ${error.message}\n`);
  process.exit(1);
});
