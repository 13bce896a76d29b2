"""What a prompt is and costs: its texts, its token count (exact, cached, or bounded without the
tokenizer), the token limits and the fields that multiply its cost.

See gateway/request/__init__.py for the order of the sub-packages."""
