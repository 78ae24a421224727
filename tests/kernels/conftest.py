"""The kernel compile tests' timing summary at the end of the session's report (outside
any captured output, so that a passing CI run shows it too)."""

from tests.kernels import aot_fixtures


def pytest_terminal_summary(terminalreporter):
  for text in aot_fixtures.SUMMARY:
    terminalreporter.write_line(text)
