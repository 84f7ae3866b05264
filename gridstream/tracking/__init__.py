"""XOR tuple tracking (Storm's acker): compact tracking tables, the tracker
ring that spreads roots over trackers, and the plain-dict reference tracker.

``gridstream.tracking.trees`` generates tuple trees and their reports for
tests and benchmarks.
"""

from gridstream.tracking.naive import NaiveTracker
from gridstream.tracking.ring import TrackerRing
from gridstream.tracking.table import TrackingTable

__all__ = ["NaiveTracker", "TrackerRing", "TrackingTable"]
