"""Defaults that the command line shows before anything heavy is imported."""

DEFAULT_PORT = 8686
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
