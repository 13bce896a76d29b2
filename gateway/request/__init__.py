"""The request path, in sub-packages by what they do, each importing only those below it:

- ``completions/`` the OpenAI endpoints (``proxy``: read, assess, decide, answer; ``models``),
  the body read and screened (``body``, ``body_values``, ``fields``), how the tiers are asked it
  (``tier_body``), a whole answer assembled from a stream (``whole``);
- ``stream/`` relaying a tier's answer (``relay``, ``taps``) and mid-stream failover
  (``resumable``, ``resume``, ``continuation``, ``stream_watch``, ``degeneration``,
  ``assemble``);
- ``route/`` the plan (``plan``, ``router``), which endpoints in which order
  (``endpoint_choice``), the request value every later step reads (``decided``) and opening
  the chain (``chain``);
- ``classify/`` the request's class (``classes``, the model, keyword rules, pre-filter);
- ``tokens/`` what a prompt is and costs (``prompt_text``, ``prompt_count``, ``prompt_bound``,
  ``count_cache``, ``limits``, ``costs``);
- ``upstream/`` the one transport seam to the tiers (``client``, ``aiohttp_transport``);
- ``events/`` reading what tiers send (``sse``, ``chunk``, ``sse_counter``, ``stream_usage``,
  ``answer_usage``);
- and, beside them, what every step shares: the request's ``kind`` and its ``exchange``
  (spans, metrics, in-flight slot).

No import points up (tests/unit/test_import_direction.py holds the order).
Every module's job: docs/architecture.md.
"""
