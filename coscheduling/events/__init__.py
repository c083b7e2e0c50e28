"""Cluster events in: the table of API objects the core reads (``watched``), one ingest entry
per kind turning an event into the core's state (``ingest``), and DRA objects' entries
(``dra``).
"""
