"""Frontends: turn a framework's model into an IR ``Graph``. They optimise nothing."""
