"""Admission control and rate limiting in front of the waiting queue."""

from tierserve.admission.controller import AdmissionController, Decision, QueueView
from tierserve.admission.rate_meter import RateMeter
from tierserve.admission.token_bucket import TokenBucket

__all__ = ["AdmissionController", "Decision", "QueueView", "RateMeter", "TokenBucket"]
