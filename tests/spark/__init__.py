"""Spark bridge tests: a real local Spark session feeding a real local cluster."""
