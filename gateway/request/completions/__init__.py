"""The OpenAI completion endpoints and the request value: reading and screening a request, its
phases (assess, decide, answer), the ``CompletionRequest`` every later step reads, ``GET
/v1/models``.

See gateway/request/__init__.py for the order of the sub-packages."""
