"""What gateway replicas share through one Redis, each part with a local fallback.

``state``: in-flight counts, request rates, rate limits, tier health and small records
(``lua``: the scripts it runs); ``leader``: the lock that elects one replica to run resets;
``connection``: how both open and close their Redis client.
"""
