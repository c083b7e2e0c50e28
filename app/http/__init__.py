"""The HTTP edge: the extender verbs and probes, the admission webhook, ``/debug``, the web
page and the what-if."""
