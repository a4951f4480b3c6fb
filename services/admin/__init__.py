"""Operator commands that change a running cluster through its services' gRPC APIs."""
