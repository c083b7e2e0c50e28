"""The gang rules over the core's state: which gang a pod is in and quorum (``membership``),
planning a gang whole and reserving it, keeping its plan whole or giving it all back
(``admission``), Lockstep's scheduling gate (``gating``) and the gate of Volcano's queues in
front of admission, fed from the core's state (``queue_gate``; the queues' rules are the
Volcano convention's).
"""
