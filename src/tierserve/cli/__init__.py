"""The command line: ``tierserve <command>``, every command and its options."""

from tierserve.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
