"""Shows the measured host-cost table (microseconds are reported, never asserted)."""

import stub


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    table = config.stash.get(stub.SUMMARY, None)
    if table is not None:
        terminalreporter.write_sep("-", "host cost per op call, numbapos on the stub CUDA driver")
        terminalreporter.write_line(table)
