"""A request's class (tolerant, code, math, long) and the reason: overrides, the trained prompt
model or the keyword rules, the literal pre-filter.

See gateway/request/__init__.py for the order of the sub-packages."""
