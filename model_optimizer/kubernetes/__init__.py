"""``model-optimizer deploy kubernetes``: plain manifests rendered from the deployment spec.

``options.py`` (what the operator chooses), ``objects.py`` (labels and small builders),
``tiers.py`` (the vLLM tiers), ``pools.py`` (opt-in InferencePools), ``gateway.py`` (gateway,
Redis, policy), ``render.py`` (all of it, pure), ``write.py`` (one file per object, written
all-or-nothing).
"""
