"""Unit tests run operators defined in the test modules themselves, so this
process lets jobs name modules under ``tests`` besides the defaults."""

from __future__ import annotations

from gridstream.jobspec import DEFAULT_JOB_MODULES, allow_job_modules

allow_job_modules((*DEFAULT_JOB_MODULES, "tests"))
