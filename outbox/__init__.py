"""outboxd agent side: the records, the state machine and the API agents call inside their own transaction."""
