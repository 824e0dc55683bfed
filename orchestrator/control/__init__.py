"""The restart controller: the drill's loop, one tracker per run, submission, closing, detach."""
