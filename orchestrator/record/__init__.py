"""The ledger and what is measured from it: recoveries, lost work, the runs' own files."""
