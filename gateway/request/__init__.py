"""The request path, read top to bottom: ``proxy`` (the OpenAI endpoints) → ``plan`` (count,
``classify`` with its literal ``prefilter``, ``limits``, ``router``: pure decisions) → ``relay``
(the chain of tiers, SSE, cancellation) over ``upstream`` (the one httpx seam), with
``exchange`` keeping one request's books (spans, metrics, in-flight slot)."""
