"""The warm strategy (issue 12): spare processes with the framework loaded, a coordinator per job,
and peer state transfer, so that a rank's death costs no cold start and no rollback."""
