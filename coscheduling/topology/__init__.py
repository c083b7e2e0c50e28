"""Where things are: topology domains from node labels (``domains``), GPU islands and NUMA
zones inside a node (``gpus``), and which nodes a pod may use at all (``eligibility``).

Values and pure functions over records; nothing here holds or reads the core's state.
"""
