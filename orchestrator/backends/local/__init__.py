"""The local backend (embedded default): ranks as local processes, no cluster."""
