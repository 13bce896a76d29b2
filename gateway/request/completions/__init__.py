"""The OpenAI completion endpoints: reading and screening a request, its phases (assess,
decide, answer), how its tiers are asked it, ``GET /v1/models``.

See gateway/request/__init__.py for the order of the sub-packages."""
