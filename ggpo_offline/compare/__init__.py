"""Comparison: every method x seed on one pool, reported as tables and figures."""
