"""The request path, read top to bottom: ``proxy`` (the OpenAI endpoints: the request's
``kind``, its ``body`` and ``fields``) → ``plan`` (``costs``, ``prompt_count``, ``classify``,
``limits``, ``router``: pure decisions) → ``chain`` (the first endpoint that answers, over
``upstream``, the one httpx seam) → ``relay`` (SSE, cancellation; a stream whose tier fails or
degenerates midway goes on on the next one through ``resumable``, ``resume`` and
``continuation``; a whole answer asked as a stream is put back together by ``whole``), with
``exchange`` keeping one request's books (spans, metrics, in-flight slot). Every module's job:
docs/architecture.md."""
