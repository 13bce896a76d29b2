"""Below every other package: operator YAML loading, environment paths, variant-folder names.

Imports none of gateway, backends, optimizer, measure or model_optimizer (a unit test checks).
"""
