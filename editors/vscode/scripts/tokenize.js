#!/usr/bin/env node
// Tokenize .flow files with the extension's TextMate grammar, exactly as VS Code does
// (vscode-textmate + the Oniguruma regex engine), and print the tokens as JSON:
//   {"<file>": [[{"start": 0, "end": 4, "text": "flow", "scopes": ["source.flow", ...]}, ...], ...]}
// One inner list per line; offsets are UTF-16 code units within the line, as in the editor.
// Used by the Python tests (scope coverage, agreement with the parser) and the screenshot.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const vsctm = require("vscode-textmate");
const oniguruma = require("vscode-oniguruma");

const GRAMMAR = path.join(__dirname, "..", "syntaxes", "flow.tmLanguage.json");

async function loadGrammar() {
  const wasm = fs.readFileSync(path.join(path.dirname(require.resolve("vscode-oniguruma")), "onig.wasm"));
  await oniguruma.loadWASM(wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength));
  const registry = new vsctm.Registry({
    onigLib: Promise.resolve({
      createOnigScanner: (patterns) => new oniguruma.OnigScanner(patterns),
      createOnigString: (text) => new oniguruma.OnigString(text),
    }),
    loadGrammar: async (scopeName) =>
      scopeName === "source.flow" ? vsctm.parseRawGrammar(fs.readFileSync(GRAMMAR, "utf8"), GRAMMAR) : null,
  });
  return registry.loadGrammar("source.flow");
}

function tokenize(grammar, text) {
  let stack = vsctm.INITIAL;
  return text.split(/\r?\n/).map((line) => {
    const result = grammar.tokenizeLine(line, stack);
    stack = result.ruleStack;
    return result.tokens.map((t) => ({
      start: t.startIndex,
      end: Math.min(t.endIndex, line.length),
      text: line.slice(t.startIndex, t.endIndex),
      scopes: t.scopes,
    }));
  });
}

async function main(files) {
  if (files.length === 0) {
    process.stderr.write("usage: tokenize.js FILE.flow...\n");
    process.exit(2);
  }
  const grammar = await loadGrammar();
  const out = {};
  for (const file of files) out[file] = tokenize(grammar, fs.readFileSync(file, "utf8"));
  process.stdout.write(JSON.stringify(out) + "\n");
}

module.exports = { loadGrammar, tokenize };

if (require.main === module) {
  main(process.argv.slice(2)).catch((error) => {
    process.stderr.write(`tokenize.js: ${error.message}\n`);
    process.exit(1);
  });
}
