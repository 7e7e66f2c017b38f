// The VS Code extension: registers the .flow language (grammar and language configuration come
// from package.json) and runs the flowc language server, `python -m flowc lsp`, over stdio.
"use strict";

const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");
const { serverCommand, startFailureMessage } = require("./serverCommand");

/** @type {LanguageClient | undefined} */
let client;

async function selectedInterpreter() {
  const python = vscode.extensions.getExtension("ms-python.python");
  if (!python) return undefined;
  try {
    const api = python.isActive ? python.exports : await python.activate();
    const environment = api.environments.getActiveEnvironmentPath();
    return environment && environment.path;
  } catch {
    return undefined; // an older Python extension without the environments API
  }
}

async function start(context) {
  const settings = vscode.workspace.getConfiguration("flowc");
  const { command, args } = serverCommand(
    { python: settings.get("python"), extraArgs: settings.get("server.extraArgs") },
    await selectedInterpreter(),
    process.platform,
  );
  client = new LanguageClient(
    "flowc",
    "flowc language server",
    { command, args },
    {
      documentSelector: [{ language: "flow" }],
      synchronize: { fileEvents: vscode.workspace.createFileSystemWatcher("**/*.flow") },
    },
  );
  try {
    await client.start();
  } catch (error) {
    vscode.window.showErrorMessage(startFailureMessage(command, error && error.message ? error.message : error));
    client = undefined;
  }
  context.subscriptions.push({ dispose: () => client && client.stop() });
}

async function activate(context) {
  context.subscriptions.push(
    vscode.commands.registerCommand("flowc.restartServer", async () => {
      if (client) await client.stop();
      await start(context);
    }),
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      if (event.affectsConfiguration("flowc.python") || event.affectsConfiguration("flowc.server")) {
        if (client) await client.stop();
        await start(context);
      }
    }),
  );
  await start(context);
}

async function deactivate() {
  if (client) await client.stop();
}

module.exports = { activate, deactivate };
