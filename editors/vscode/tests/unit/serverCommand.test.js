"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { serverCommand, startFailureMessage } = require("../../src/serverCommand");

test("the configured python wins over the selected interpreter", () => {
  const got = serverCommand({ python: " /opt/venv/bin/python ", extraArgs: [] }, "/usr/bin/python3.12", "linux");
  assert.deepEqual(got, { command: "/opt/venv/bin/python", args: ["-m", "flowc", "lsp"] });
});

test("without a setting, the Python extension's interpreter is used", () => {
  assert.equal(serverCommand({ python: "" }, "/home/u/.venv/bin/python", "linux").command, "/home/u/.venv/bin/python");
});

test("without either, the platform's python is used", () => {
  assert.equal(serverCommand({}, undefined, "linux").command, "python3");
  assert.equal(serverCommand({}, undefined, "win32").command, "python");
});

test("extra arguments are appended after `lsp`", () => {
  assert.deepEqual(serverCommand({ extraArgs: ["--stdio"] }, undefined, "darwin").args, ["-m", "flowc", "lsp", "--stdio"]);
});

test("a start failure names the command and the fix", () => {
  const message = startFailureMessage("python3", "spawn python3 ENOENT");
  assert.match(message, /python3 -m flowc lsp/);
  assert.match(message, /flowc\.python/);
});
