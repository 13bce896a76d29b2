"""Measuring a served model: the serving benchmark (``model-optimizer bench``) and its parts."""
