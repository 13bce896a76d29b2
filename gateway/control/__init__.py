"""Off the request path: what the gateway knows about its tiers and the loops that act on it.

``tier_status`` (the board: supervisor states, scrapes, reset marks → the router's statuses),
``tier_signals`` and ``tier_memory`` (per-tier monitoring), ``resets`` (the KV-pool reset
coordinator) with ``reset_schedule`` (its pure decision) and ``ttft_drift``, and ``shadow``
(background comparisons of cheaper tiers with the reference tier).
"""
