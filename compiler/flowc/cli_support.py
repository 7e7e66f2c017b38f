"""What the commands of the `flowc` command line share: the command group's class (internal
errors, and how an error line reads: `flowc: ...`), exit codes, reading a `.flow` file named on
the command line, checking it, colour.

`flowc.cli` holds the command group and the compiler's commands; `flowc.citools.commands`
holds the commands for pipeline authors' CI (`test`, `diff`). Both import this module, so
neither imports the other.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

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


def show_error(error: click.ClickException) -> None:
    """An error click would print as `Error: MESSAGE`, printed as every other error line of flowc
    reads, `flowc: MESSAGE` (a usage error's usage lines first, as click prints them). An error
    that prints itself some other way (`flowc` alone shows the help) is left to do so."""
    if type(error).show not in (click.ClickException.show, click.UsageError.show):
        error.show()
        return
    ctx = getattr(error, "ctx", None)
    if isinstance(error, click.UsageError) and ctx is not None:
        help_names = ctx.command.get_help_option_names(ctx) if ctx.command.get_help_option(ctx) is not None else ()
        hint = f"Try '{ctx.command_path} {max(help_names, key=len)}' for help.\n" if help_names else ""
        click.echo(f"{ctx.get_usage()}\n{hint}", err=True, color=ctx.color)
    click.echo(f"flowc: {error.format_message()}", err=True)


class FlowcGroup(click.Group):
    """Turns any unexpected exception into one line and exit code 3 (unless --debug); every error
    line starts `flowc: `, click's own (`Error: ...`) included."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:  # click's main, less its printing of errors: a command's ctx.exit(N) comes back as N
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click.ClickException as error:
            show_error(error)
            sys.exit(error.exit_code)
        except click.Abort:
            click.echo("flowc: aborted", err=True)
            sys.exit(EXIT_ERRORS)
        sys.exit(code if isinstance(code, int) else EXIT_OK)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except BrokenPipeError:  # the reader of our output went away (`flowc ... | head`): as a Unix tool on SIGPIPE
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # (so the interpreter's last flush fails quietly too)
            ctx.exit(EXIT_PIPE)
        except Exception as error:  # noqa: BLE001 - the last line of defence for the user
            if ctx.params.get("debug"):
                raise
            click.echo(f"flowc: internal error: {type(error).__name__}: {error}", err=True)
            click.echo("this is a bug in flowc; rerun with --debug for the traceback and report it", err=True)
            ctx.exit(EXIT_INTERNAL)
