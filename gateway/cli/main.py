"""``gateway``: serve, list codecs, and talk to a running gateway.

Every ``gateway`` command starts here, so this module imports only click and the definitions of
the commands, which import what they use when they run: the client commands their client
(``gateway.cli.client``, ``gateway.cli.security``), ``codecs`` the registry. ``serve``, whose
module imports the whole server, is a lazy command: imported when it runs or shows its own help,
never for ``gateway --help`` or another command (tests/test_cli.py holds this).
"""

from __future__ import annotations

import importlib

import click

from gateway import __version__
from gateway.cli.client import COMMANDS as client_commands
from gateway.cli.security import acls, users


class LazyGroup(click.Group):
    """A group with commands imported only when looked up by name (to run, or for their help).

    ``lazy`` maps a command's name to ``("module:attribute", one-line help)``; the group's own
    help lists it with that line, leaving the module unimported.
    """

    def __init__(self, *args, lazy: dict[str, tuple[str, str]], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and name not in self.commands:
            module, _, attribute = self.lazy[name][0].partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))  # as click lays out a group's commands
        rows = []
        for name in names:
            if name in self.lazy and name not in self.commands:
                rows.append((name, self.lazy[name][1]))
            elif (command := self.get_command(ctx, name)) is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, lazy={
    "serve": ("gateway.cli.serve:serve", "Serve the given protocols from one storage engine."),
})
@click.version_option(__version__, prog_name="polygate")
def main() -> None:
    """polygate: one log, many protocols."""


@main.command()
def codecs() -> None:
    """List the installed codecs with their default ports."""
    from gateway.registry import Registry

    reg = Registry.discover()
    for name, plugin in sorted(reg.codecs.items()):
        click.echo(f"{name:<8} port {plugin.default_port:<6} frame limit {plugin.max_frame_size:<10} "
                   f"{plugin.versions:<12} {plugin.description}")
    for name, reason in sorted(reg.failures.items()):
        click.echo(f"{name:<8} BROKEN: {reason}")


main.add_command(users)
main.add_command(acls)
for _command in client_commands:
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    main()
