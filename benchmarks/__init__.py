"""Benchmarks: ``make bench`` runs them all and writes JSON plus a table to bench-results/."""
