-- One meaning of 'given_back' (issue 36): an attempt given back is one not
-- used. A worker that lets go of a task unfinished, its attempt spent (it
-- stopped mid-task, or has no handler for the task's kind), now records it
-- as 'interrupted'. Both were 'given_back' before; attempts recorded then
-- keep their name.
--
-- interrupted  A failed attempt for the queue (the task is retried after
--              the backoff, or failed after its attempts), named by the
--              worker in the same transaction as its failure
--              (queue::store::fail_as), after the attempts trigger wrote
--              'failed'.

ALTER TABLE attempts DROP CONSTRAINT attempts_outcome_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_outcome_check CHECK (outcome IN (
    'running', 'completed', 'failed', 'taken_over',
    'cancelled', 'timed_out', 'snoozed', 'given_back', 'interrupted'));
