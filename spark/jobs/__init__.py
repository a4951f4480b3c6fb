"""Spark jobs: the batch request-latency report and the streaming health watch."""
