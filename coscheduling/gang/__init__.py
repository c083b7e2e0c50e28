"""The gang rules over the core's state: which gang a pod is in and quorum (``membership``),
planning a gang whole and reserving it, keeping its plan whole or giving it all back
(``admission``), Lockstep's scheduling gate (``gating``) and Volcano's enqueue step
(``enqueue``).
"""
