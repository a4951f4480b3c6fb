"""What coordinators whose state lives in an internal topic share: ``schema`` (record formats
declared as data, and their codec)."""
