"""Spark jobs over the services' metrics: a PySpark data source for the gRPC Metrics endpoints
(:mod:`spark.datasource`) and the reports built on it (:mod:`spark.jobs`)."""
