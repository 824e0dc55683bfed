"""Restart strategies: what each does in the job that is already there, or with a new one."""
