"""The routing policy's ``live_routes`` section, and measured figures as live traffic finds them
(pure).

With ``live_routes.enabled``, each replica compares, every ``interval_s`` seconds, each tier's
per-token time in its real streamed answers (gateway/control/live_figures.py) with the
calibration's figure for the load each was sent under (alone; at the calibration's concurrency,
``concurrency / throughput``; straight between: gateway/control/live_routes.py ``LoadCurve``),
and derives the routes again on the calibration's figures scaled by that ratio: a tier slower
than calibrated at the load it carries now (something else took its CPU, a throttled or
failing host) costs what it costs now, with no calibration run. A tier with no recent traffic
is idle: its calibration alone is its cost now.

- **recent**: the answers of the last ``recent_s`` seconds, at least ``min_samples`` of them;
  their load is the load the tier is under now. A tier that got no recent answers keeps the
  factor of its answers within ``hold_s`` (a tier the routes moved away from gets no traffic:
  without the hold it would come back at once, slow or not); past ``hold_s`` it is back on its
  calibration, and traffic tells again.
- **only a real difference**: the factor is the median of each answer's per-token time over
  the calibration's at its load, applied only when 1 lies outside that median's 95 % interval
  (order statistics), and more than ``tolerance`` (5 %) away from 1; otherwise 1. A tier only
  as busy as calibrated keeps 1: the load is the replica's own requests in flight on the tier
  (with several replicas, a part of it). The derivation then needs its own confidence and
  hysteresis as for any figures (gateway/policy/derive.py), so a route moves only on a
  significant difference.
- **what is scaled**: the per-token time (the calibration's per-prompt samples, so pairs stay
  pairs: gateway/policy/derive.py ``apply_factors``) and the throughput; TTFT stays the
  calibration's (it depends on the prompt, which live traffic does not hold constant). Quality
  figures and the emulated rule are untouched.
- **a shared host**: tiers on one host's cores slow each other (two busy tiers were each
  ~1.5x their calibration on 2 cores, an idle one not at all, and the routes flapped between
  them: 12 changes in 5 minutes, benchmarks/bench_live_routes.py --steady). With
  ``shared_host`` (on), when two or more tiers have recent answers, each recent factor is taken
  relative to their median (gateway/control/live_routes.py ``relative_to_host``): a tier is
  slow only against the others under the same load. Turn it off where each tier has its own
  machine.
- **recovery**: a tier the routes moved away from gets no traffic, so with ``probe_s`` set it
  is probed instead (gateway/control/live_probes.py): ``min_samples`` short requests of
  ``probe_tokens`` tokens at most every ``probe_s`` seconds while its factor is above 1 and it
  had no answer for ``probe_s``; its factor is then judged on the probe's answers: as
  calibrated again, it is back in the same look.
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
    probe_s: float | None = Field(default=60.0, gt=0)  # between probes of a slowed tier
    probe_tokens: int = Field(default=16, ge=2, le=256)  # tokens a probe asks for
    tolerance: float = Field(default=0.05, ge=0, lt=1)  # factors this close to 1 count as 1
    # The tiers share one host's cores (up, compose, co-located pods): a slowdown the busy
    # tiers share is the host's, and each is judged relative to their median.
    shared_host: bool = True
