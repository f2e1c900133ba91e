"""The Textual dashboard (`kvbudget tui`): a pure gRPC client of the daemon.

Entry points: `kvbudget.tui.app.KVBudgetApp(target, token)` and
`kvbudget.tui.app.run_dashboard(target, token)`. This package imports neither torch, NVML
nor the daemon; importing it (this file) pulls in nothing heavy.
"""

from kvbudget.client.target import DEFAULT_TARGET  # one default for every client command

__all__ = ["DEFAULT_TARGET"]
