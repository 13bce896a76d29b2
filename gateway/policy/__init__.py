"""The routing policy: ``schema`` (the YAML's pydantic models, parsing and one-line errors) and
``store`` (loading the policy file, hot reload, the last good policy)."""
