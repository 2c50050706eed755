"""The ``huddle`` command."""

from __future__ import annotations

import argparse
from importlib.metadata import version


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="huddle",
        description="Huddle: a real-time, human-in-the-loop session server for AI agents.",
    )
    parser.add_argument("--version", action="version", version=f"huddle {version('huddle')}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
    return 0
