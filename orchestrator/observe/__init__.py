"""Watching a running attempt: scheduler polls, event and heartbeat tails, failure signs."""
