"""Where a request goes: the plan (class, limits, chain of tiers), the order of a tier's
endpoints, the request value every later step reads (``decided.CompletionRequest``), and opening
the chain (the first endpoint that answers in time).

See gateway/request/__init__.py for the order of the sub-packages."""
