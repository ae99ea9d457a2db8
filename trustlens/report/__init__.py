"""A static, self-contained HTML report of recorded runs (`trustlens report`; docs/report.md)."""

from trustlens.report.page import build_report, write_report

__all__ = ["build_report", "write_report"]
