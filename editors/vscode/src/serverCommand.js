// How the extension starts `flowc lsp`: which Python, which arguments. Kept free of the
// `vscode` module so it can be unit-tested with node's own test runner.
"use strict";

/**
 * The command line that starts the language server.
 * @param {{python?: string, extraArgs?: string[]}} settings  the user's `flowc.*` settings
 * @param {string | undefined} selectedInterpreter  the Python extension's active interpreter, if any
 * @param {string} platform  process.platform
 * @returns {{command: string, args: string[]}}
 */
function serverCommand(settings, selectedInterpreter, platform) {
  const configured = (settings.python || "").trim();
  const fallback = platform === "win32" ? "python" : "python3";
  const python = configured || (selectedInterpreter || "").trim() || fallback;
  const extra = Array.isArray(settings.extraArgs) ? settings.extraArgs.map(String) : [];
  return { command: python, args: ["-m", "flowc", "lsp", ...extra] };
}

/** What to tell the user when the server cannot start, naming the fix. */
function startFailureMessage(command, error) {
  return (
    `flowc: could not start the language server with \`${command} -m flowc lsp\` (${error}). ` +
    "Install flowc in that environment (pip install flowc) or set `flowc.python` to a Python that has it."
  );
}

module.exports = { serverCommand, startFailureMessage };
