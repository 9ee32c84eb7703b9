"""Every interval and p-value weightgraft prints comes from here; each one's coverage or error rate
is measured by a seeded simulation at the sample sizes the defaults use, and the suite holds it
where docs/statistics.md says it holds (``tests/stats/test_stats.py``; the figures are in the docs).

- :func:`share_ci`: a share ``sum(region) / sum(whole)`` over prompts with its interval held at
  95% on every design of docs/statistics.md (Fieller's bounds at 99.99999%: ``level`` is the level
  held, ``widened`` Fieller's own), or NaN bounds and the reason (:func:`share_interval`) where none can be given;
- :func:`level_text`: an interval's level as tables print it beside each row;
- :func:`mean_ci`: a mean over prompts with its t interval, declined with fewer than 3 prompts or
  effects too skewed for their number;
- :func:`paired_p`: a region's per-prompt effect against its per-prompt null, across prompts
  (exact where the region is exchangeable with its null draws under the null);
- :func:`empirical_p`: one value against draws from its null (the found sets' controls);
- :func:`holm`: Holm's step-down adjustment over one family of tests;
- :func:`sign_test_p`: on how many prompts a difference is above 0 (exact for any distribution of
  median 0);
- :func:`rate_ci`: a top-k rate with its Clopper-Pearson interval;
- :func:`paired_rate_difference_ci`: two top-k rates on the same prompts, their difference with
  Newcombe's paired interval;
- :func:`prompts_needed`: about how many prompts like the observed ones an undecided share needs;
- :func:`model_label_p`: are the models of one group more alike than a group of others?
"""

from weightgraft.stats.empirical import empirical_p
from weightgraft.stats.labels import model_label_p, models_needed
from weightgraft.stats.means import (
                                    Interval,
                                    level_text,
                                    mean_ci,
                                    mean_interval,
                                    share_ci,
                                    share_interval,
                                    share_threshold_p,
)
from weightgraft.stats.multiple import holm
from weightgraft.stats.needed import prompts_needed
from weightgraft.stats.paired import least_p, paired_p
from weightgraft.stats.rates import paired_rate_difference_ci, rate_ci, rate_cis
from weightgraft.stats.signs import sign_test_p

__all__ = ["Interval", "empirical_p", "holm", "least_p", "level_text", "mean_ci", "mean_interval", "model_label_p",
           "models_needed", "paired_p", "paired_rate_difference_ci", "prompts_needed", "rate_ci", "rate_cis", "share_ci", "share_interval", "share_threshold_p", "sign_test_p"]
