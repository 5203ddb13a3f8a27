-- One step of a support agent, in plain SQL for the sqlite3 shell:
--   sqlite3 -bail agent.db < examples/plain_sql/sqlite_agent.sql
-- The agent's checkpoint moves from revision 0 to 1 and the effect that transition implies
-- is staged IN THE SAME TRANSACTION. Re-running the script (a restarted agent repeating
-- its step) changes nothing: the compare-and-set fails, so nothing is staged twice.
BEGIN IMMEDIATE;

-- 1. The task's checkpoint exists (revision 0) before the first transition.
INSERT INTO outbox_tasks (tenant_id, task_id, phase)
VALUES ('acme', 'case-8472', 'new')
ON CONFLICT (tenant_id, task_id) DO NOTHING;

-- 2. Compare-and-set: only a task still at revision 0 moves on.
UPDATE outbox_tasks
   SET state_revision = state_revision + 1, phase = 'ticket-requested',
       state = '{"case": 8472, "step": "ticket"}'
 WHERE tenant_id = 'acme' AND task_id = 'case-8472' AND state_revision = 0;

-- 3. Stage the effect only if the compare-and-set moved the row (changes() = 1).
--    Only the required columns: the idempotency key defaults to 'acme:ticket:create:case-8472'.
INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, payload)
SELECT 'acme', 'case-8472', 'ticket:create:case-8472', 'tickets',
       '{"case": 8472, "subject": "Refund follow-up", "priority": "high"}'
 WHERE changes() = 1;

COMMIT;

-- Where things stand (the plain-SQL view of a recovery plan).
SELECT t.task_id, t.state_revision, t.phase, o.operation_id, o.status, o.idempotency_key
  FROM outbox_tasks t JOIN outbox_operations o USING (tenant_id, task_id)
 WHERE t.tenant_id = 'acme' AND t.task_id = 'case-8472';
