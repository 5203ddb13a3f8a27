"""What keeps secrets and bodies where they belong: payloads that carry credentials are
refused at the door (:mod:`.secrets`, with :mod:`.secret_keys` for key names and
:mod:`.secret_patterns` for values), payloads at rest can be sealed per tenant
(:mod:`.envelopes`: AES-256-GCM, keys from ``[protection]``), and large bodies live outside
the row, bound by digest (:mod:`.artifacts`)."""
