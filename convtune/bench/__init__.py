"""Benchmarks: convtune's runtime against its peers in one process, and the reports."""
