"""The routing policy's ``live_routes`` section, and measured figures as live traffic finds them
(pure).

With ``live_routes.enabled``, each replica compares, every ``interval_s`` seconds, each tier's
per-token time in its real streamed answers (gateway/control/live_figures.py) with the
calibration's figure for the tier alone, and derives the routes again on the calibration's
figures scaled by that ratio (gateway/control/live_routes.py): a tier that slows down under
the load it carries now (or because something else took its CPU) costs what it costs now, with
no calibration run. A tier with no recent traffic is idle: its calibration alone is its cost
now.

- **recent**: the answers of the last ``recent_s`` seconds, at least ``min_samples`` of them;
  their load is the load the tier is under now. A tier that got no recent answers keeps the
  factor of its answers within ``hold_s`` (a tier the routes moved away from gets no traffic:
  without the hold it would come back at once, slow or not); past ``hold_s`` it is back on its
  calibration, and traffic tells again.
- **only a real difference**: the factor is the live median over the calibration's, applied
  only when the calibration lies outside the live median's 95 % interval (order statistics);
  otherwise 1. The derivation then needs its own confidence and hysteresis as for any figures
  (gateway/policy/derive.py), so a route moves only on a significant difference.
- **what is scaled**: the per-token time (the calibration's per-prompt samples, so pairs stay
  pairs: gateway/policy/derive.py ``apply_factors``) and the throughput; TTFT stays the
  calibration's (it depends on the prompt, which live traffic does not hold constant). Quality
  figures and the emulated rule are untouched.
"""

from __future__ import annotations

from pydantic import Field

from common.operator_yaml import Section


class LiveRoutesPolicy(Section):
    """See the module docstring. Off by default."""

    enabled: bool = False
    interval_s: float = Field(default=30.0, gt=0)  # between two looks at the live figures
    recent_s: float = Field(default=120.0, gt=0)  # the answers that tell the load now
    hold_s: float = Field(default=900.0, gt=0)  # how long a factor outlives the tier's traffic
    min_samples: int = Field(default=8, ge=4)  # streamed answers a factor needs
