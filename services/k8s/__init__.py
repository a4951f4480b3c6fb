"""kbroker on Kubernetes: the operator's ``kbroker k8s`` commands and service discovery through
the Kubernetes API. Only this package imports the kubernetes client."""
