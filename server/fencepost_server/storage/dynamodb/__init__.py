"""The DynamoDB backend: one table, any number of stateless replicas.

`dynamodb://TABLE?endpoint=URL&region=R` in the backend registry; see
storage.py for the table format and costs, layout.py for the partitioning.
"""

from .errors import RequestRejected, RetryPolicy
from .layout import DEFAULT_PATTERNS, KeyLayout
from .storage import DynamoStorage
from .table import create_table, table_definition

__all__ = [
    "DEFAULT_PATTERNS", "DynamoStorage", "KeyLayout", "RequestRejected", "RetryPolicy",
    "create_table", "table_definition",
]
