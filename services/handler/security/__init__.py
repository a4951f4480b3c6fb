"""Who may do what: the principal a request runs as and Kafka's ACL authorization of it."""
