"""One replica's dispatch cycle: claim, check, mark ``dispatching``, send, record.

:mod:`.worker` runs the cycle; :mod:`.checks` (what a row must pass before it is sent),
:mod:`.authority` (approvals, versions, policy, budgets), :mod:`.recording` (in-flight
sends and what their outcomes write), :mod:`.settings` (what the configuration tells the
cycle), :mod:`.outcomes` (an outcome's next status), :mod:`.retry` (the persisted retry
budget and back-off), :mod:`.leases` (extending leases in flight) and :mod:`.failpoints`
(the crash points the chaos suite arms). Statements live in :mod:`dispatcher.store`."""
