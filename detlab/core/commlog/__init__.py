"""Parse NCCL/RCCL debug logs, diff two runs' facts, and check requested against effective settings."""

from .cli import main
from .compare import check_effective, diff_facts
from .lines import strip_prefix
from .parser import empty_result, parse

__all__ = ["check_effective", "diff_facts", "empty_result", "main", "parse", "strip_prefix"]
