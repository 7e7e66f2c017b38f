"""What the commands of the `flowc` command line share: exit codes, reading a `.flow` file
named on the command line, checking it, colour.

`flowc.cli` holds the command group and the compiler's commands; `flowc.citools.commands`
holds the commands for pipeline authors' CI (`test`, `diff`). Both import this module, so
neither imports the other.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from flowc.check import CheckResult, Program, check_source
from flowc.diagnostics import render_text
from flowc.sources import SourceText, read_source, read_stream

EXIT_OK, EXIT_ERRORS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_PIPE = 128 + 13  # the reader of the output went away: what a Unix tool killed by SIGPIPE exits with


def read_path(path: str) -> tuple[SourceText, Path | None]:
    """The text of the `.flow` file `path` names (`-`: stdin), or a usage error naming it and the fix."""
    if not path:
        raise click.UsageError("an empty file name was given; pass a .flow file")
    file = None if path == "-" else Path(path)
    try:
        return (read_stream(sys.stdin.buffer, "<stdin>") if file is None else read_source(file)), file
    except FileNotFoundError:
        raise click.UsageError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise click.UsageError(f"{path} is a directory; pass a .flow file") from None
    except UnicodeDecodeError as error:
        raise click.UsageError(
            f"{file or '<stdin>'} is not UTF-8 text ({error.reason} at byte {error.start}); pass a .flow file, or save it as UTF-8"
        ) from None
    except OSError as error:
        raise click.UsageError(f"cannot read {file or '<stdin>'}: {error.strerror}; pass a .flow file") from None


def check_path(path: str) -> CheckResult:
    source, file = read_path(path)
    return check_source(source.text, "<stdin>" if path == "-" else path, file)


def color(option: bool | None) -> bool:
    return sys.stdout.isatty() if option is None else option


def checked_program(file: str, colour: bool | None) -> Program:
    """The program of `file`; its diagnostics on stderr and exit 1 when it has errors."""
    result = check_path(file)
    if not result.ok or result.program is None:
        click.echo(render_text(result.diagnostics, result.sources, color(colour)), err=True)
        click.echo(f"flowc: {file} has errors; fix them first", err=True)
        sys.exit(EXIT_ERRORS)
    return result.program


color_option = click.option("--color/--no-color", default=None, help="Colour the output (default: when a terminal).")
