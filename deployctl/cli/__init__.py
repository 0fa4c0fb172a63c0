"""The deployctl command line: parse options, run one operation over the fleet, report.

`session` holds what every command shares (the app, the shared options, `Session`,
`fleet_command`, the exit status, `main`); each other module is one family of commands.
"""

from deployctl.cli.session import app, exit_status, main, raise_open_files_limit, run

# isort: off
# Each family registers its commands when imported: this order is `deployctl --help`'s.
from deployctl.cli import inventory, patch, logs, runs, tune, metrics, dashboard, rollout  # noqa: F401
# isort: on

__all__ = ["app", "exit_status", "main", "raise_open_files_limit", "run"]
