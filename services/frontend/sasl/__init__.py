"""SASL on the frontend's SASL listeners: the mechanisms (PLAIN, SCRAM-SHA-256/512,
OAUTHBEARER), the credentials they check, and the authenticator that runs SaslHandshake and
SaslAuthenticate on a connection (Kafka's SaslServerAuthenticator)."""
