"""Reading what tiers send, pure: the one SSE reader, the one OpenAI chunk reader, the relayed
stream's token counter, the usage of a stream and of a whole answer.

See gateway/request/__init__.py for the order of the sub-packages."""
